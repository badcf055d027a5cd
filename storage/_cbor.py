"""Strict canonical DAG-CBOR: the one encode and one decode path for structured blocks.

See specs/manifest.md#dag-cbor. Size is bounded first; then :func:`_scan` walks the item heads
iteratively (no recursion, no values built) to bound nesting depth and to make sure exactly one
complete item fills the bytes. Only then does the ``dag_cbor`` package decode (it refuses
NaN/Infinity, 16/32-bit floats, non-minimal integers, unsorted or non-string map keys and tags
other than 42); the result is re-encoded and the bytes compared, so exactly one encoding of any
value is accepted. Errors of ``dag_cbor`` and ``multiformats`` stay inside this module: they
become CBORDecodeError.

``_scan`` is the same walk as ``cnode.auth._cbor._scan`` (which also counts items); the two layers
do not import each other, so each keeps its copy.
"""

from __future__ import annotations

from typing import Any

import dag_cbor
import multiformats
from dag_cbor.decoding.err import CBORDecodingError
from dag_cbor.encoding.err import CBOREncodingError

from . import limits
from ._cid import CID, from_ipld, to_ipld
from ._exceptions import (
    BlockTooLargeError,
    CBORDecodeError,
    InvalidCIDError,
    NonCanonicalCBORError,
    StorageError,
)


def _to_ipld(value: Any, depth: int) -> Any:
    if depth > limits.MAX_CBOR_DEPTH:
        raise CBORDecodeError(f"value nested deeper than MAX_CBOR_DEPTH {limits.MAX_CBOR_DEPTH}")
    if isinstance(value, CID):
        return to_ipld(value)
    if isinstance(value, dict):
        return {k: _to_ipld(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_ipld(v, depth + 1) for v in value]
    return value


def _from_ipld(value: Any) -> Any:
    """Links to :class:`CID`; recursion is bounded because :func:`_scan` bounded the depth."""
    if isinstance(value, multiformats.CID):
        try:
            return from_ipld(value)
        except InvalidCIDError as exc:
            raise CBORDecodeError(f"link in DAG-CBOR: {exc}") from exc
    if isinstance(value, dict):
        return {k: _from_ipld(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_ipld(v) for v in value]
    return value


def _scan(data: bytes) -> None:
    """Check the item structure of ``data`` without building values; CBORDecodeError if bad.

    Refuses truncation, bytes after the item, indefinite lengths and reserved heads, and arrays
    or maps nested deeper than MAX_CBOR_DEPTH (empty ones open no level).
    """
    pos, n = 0, len(data)
    stack: list[int] = []  # items still to read in each open array/map (maps count 2 per entry)
    while True:
        if pos >= n:
            raise CBORDecodeError("malformed DAG-CBOR: truncated, the data ends inside an item")
        major, info = data[pos] >> 5, data[pos] & 0x1F
        pos += 1
        if info < 24:
            arg = info
        elif info <= 27:
            size = 1 << (info - 24)
            if pos + size > n:
                raise CBORDecodeError("malformed DAG-CBOR: truncated inside an item head")
            arg = int.from_bytes(data[pos : pos + size], "big")
            pos += size
        else:
            raise CBORDecodeError("malformed DAG-CBOR: indefinite-length or reserved item head")
        if major in (2, 3):  # byte string, text string
            if arg > n - pos:
                raise CBORDecodeError("malformed DAG-CBOR: truncated, a string runs past the end")
            pos += arg
        elif major in (4, 5):  # array, map
            count = arg * (2 if major == 5 else 1)
            if count > n - pos:  # every item takes at least one byte
                raise CBORDecodeError(
                    "malformed DAG-CBOR: truncated, a container claims more items than bytes"
                )
            if count:
                if len(stack) >= limits.MAX_CBOR_DEPTH:
                    raise CBORDecodeError(
                        f"DAG-CBOR nested deeper than MAX_CBOR_DEPTH {limits.MAX_CBOR_DEPTH}"
                    )
                stack.append(count)
                continue
        elif major == 6:  # tag: the tagged item follows as the next item
            continue
        while stack:  # a complete item ended: close the containers it completes
            stack[-1] -= 1
            if stack[-1]:
                break
            stack.pop()
        if not stack:
            break
    if pos != n:
        raise CBORDecodeError(f"malformed DAG-CBOR: {n - pos} bytes after the end of the item")


def _summary(exc: Exception) -> str:
    """The prose lines of a dag_cbor error, without its byte-dump lines."""
    lines = [
        line.strip()
        for line in str(exc).splitlines()
        if line.strip() and "^" not in line and not line.strip().startswith(("At byte", "Key at"))
    ]
    return " ".join(lines)[:300] or type(exc).__name__


def encode(value: Any) -> bytes:
    """Canonical DAG-CBOR bytes of ``value`` (dicts with str keys, lists, CIDs, ints, floats...)."""
    try:
        data = dag_cbor.encode(_to_ipld(value, 0))
    except (CBOREncodingError, TypeError, ValueError) as exc:
        raise StorageError(f"cannot encode as DAG-CBOR: {exc}") from exc
    assert isinstance(data, bytes)
    if len(data) > limits.MAX_BLOCK_SIZE:
        raise BlockTooLargeError(
            f"DAG-CBOR node of {len(data)} bytes exceeds MAX_BLOCK_SIZE {limits.MAX_BLOCK_SIZE}"
        )
    return data


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decode one strict canonical DAG-CBOR node; CIDs come back as :class:`CID`.

    Raises CBORDecodeError (malformed, truncated, too deep, bad link), NonCanonicalCBORError, or
    BlockTooLargeError (over MAX_BLOCK_SIZE). Size and depth are checked before decoding.
    """
    if len(data) > limits.MAX_BLOCK_SIZE:
        raise BlockTooLargeError(
            f"DAG-CBOR node of {len(data)} bytes exceeds MAX_BLOCK_SIZE {limits.MAX_BLOCK_SIZE}"
        )
    raw = bytes(data)
    _scan(raw)
    try:
        value = dag_cbor.decode(raw)
    except CBORDecodingError as exc:
        first = _summary(exc)
        if "canonical" in str(exc) or "would have been enough" in str(exc):
            raise NonCanonicalCBORError(f"non-canonical DAG-CBOR: {first}") from exc
        raise CBORDecodeError(f"malformed DAG-CBOR: {first}") from exc
    except (ValueError, KeyError, TypeError) as exc:  # multiformats rejecting a link's bytes
        raise CBORDecodeError(f"malformed DAG-CBOR link: {exc}") from exc
    result = _from_ipld(value)
    try:
        again = dag_cbor.encode(value)
    except (CBOREncodingError, TypeError, ValueError) as exc:
        raise NonCanonicalCBORError(f"DAG-CBOR value cannot be re-encoded: {exc}") from exc
    if again != raw:
        raise NonCanonicalCBORError("non-canonical DAG-CBOR: re-encoding gives different bytes")
    return result
