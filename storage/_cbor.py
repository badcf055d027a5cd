"""Strict canonical DAG-CBOR: the one encode and one decode path for structured blocks.

See specs/manifest.md#dag-cbor. Decoding uses the ``dag_cbor`` package (which already refuses
NaN/Infinity, 16/32-bit floats, non-minimal integers, unsorted or non-string map keys and tags
other than 42) and then re-encodes the result and compares bytes, so exactly one encoding of any
value is accepted. Sizes and nesting depth are bounded before anything else happens. Errors of
``dag_cbor`` and ``multiformats`` stay inside this module: they become CBORDecodeError.
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


def _from_ipld(value: Any, depth: int) -> Any:
    if depth > limits.MAX_CBOR_DEPTH:
        raise CBORDecodeError(f"DAG-CBOR nested deeper than MAX_CBOR_DEPTH {limits.MAX_CBOR_DEPTH}")
    if isinstance(value, multiformats.CID):
        try:
            return from_ipld(value)
        except InvalidCIDError as exc:
            raise CBORDecodeError(f"link in DAG-CBOR: {exc}") from exc
    if isinstance(value, dict):
        return {k: _from_ipld(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_ipld(v, depth + 1) for v in value]
    return value


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
    BlockTooLargeError (over MAX_BLOCK_SIZE).
    """
    if len(data) > limits.MAX_BLOCK_SIZE:
        raise BlockTooLargeError(
            f"DAG-CBOR node of {len(data)} bytes exceeds MAX_BLOCK_SIZE {limits.MAX_BLOCK_SIZE}"
        )
    raw = bytes(data)
    try:
        value = dag_cbor.decode(raw)
    except CBORDecodingError as exc:
        first = _summary(exc)
        if "canonical" in str(exc) or "would have been enough" in str(exc):
            raise NonCanonicalCBORError(f"non-canonical DAG-CBOR: {first}") from exc
        raise CBORDecodeError(f"malformed DAG-CBOR: {first}") from exc
    except RecursionError as exc:
        raise CBORDecodeError(
            f"DAG-CBOR nested deeper than MAX_CBOR_DEPTH {limits.MAX_CBOR_DEPTH}"
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:  # multiformats rejecting a link's bytes
        raise CBORDecodeError(f"malformed DAG-CBOR link: {exc}") from exc
    result = _from_ipld(value, 0)
    try:
        again = dag_cbor.encode(value)
    except (CBOREncodingError, TypeError, ValueError) as exc:
        raise NonCanonicalCBORError(f"DAG-CBOR value cannot be re-encoded: {exc}") from exc
    if again != raw:
        raise NonCanonicalCBORError("non-canonical DAG-CBOR: re-encoding gives different bytes")
    return result
