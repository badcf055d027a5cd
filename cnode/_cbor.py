"""Strict, bounded, canonical DAG-CBOR: the one encoder and decoder of cnode.

``storage`` (manifests, CAR headers) and ``auth`` (envelopes) both run on it; it lives here,
under the layers, so neither imports the other. Each layer passes its own limits and turns
:class:`CBORError` into its own error type (``storage/_cbor.py`` also maps links to its CIDs).

``dag_cbor`` decodes recursively and allocates as it goes; before it sees untrusted bytes,
:func:`scan_items` checks the item structure iteratively (no recursion, no values built): exactly
one item fills the buffer, nothing is truncated, no indefinite lengths, nesting and item counts
within the caller's limits. Only then does ``dag_cbor`` decode (it refuses NaN/Infinity, 16/32-bit
floats, non-minimal integers, unsorted or duplicate map keys and tags other than 42); the value is
re-encoded and the bytes compared, so exactly one encoding of any value is accepted. Errors of
``dag_cbor`` stay inside this module.
"""

from __future__ import annotations

from typing import Any

import dag_cbor
from dag_cbor.decoding.err import CBORDecodingError
from dag_cbor.encoding.err import CBOREncodingError

__all__ = ["CBORError", "CBORShapeError", "decode", "encode", "scan_items"]


class CBORError(ValueError):
    """Raised by :func:`encode` and :func:`decode` when a value or bytes are not DAG-CBOR.

    ``non_canonical`` is true when the bytes are well-formed CBOR but not the one canonical
    DAG-CBOR encoding of their value.
    """

    def __init__(self, message: str, *, non_canonical: bool = False) -> None:
        super().__init__(message)
        self.non_canonical = non_canonical


def encode(value: Any) -> bytes:
    """Canonical DAG-CBOR bytes of ``value``; CBORError if it holds kinds DAG-CBOR cannot carry.

    Links must already be ``multiformats.CID`` objects (``storage`` converts its own).
    """
    try:
        data = dag_cbor.encode(value)
    except (CBOREncodingError, TypeError, ValueError) as exc:
        raise CBORError(f"cannot encode as DAG-CBOR: {exc}") from exc
    assert isinstance(data, bytes)
    return data


def decode(data: bytes, *, max_size: int, max_depth: int, max_items: int) -> Any:
    """Decode one bounded, canonical DAG-CBOR item; links come back as ``multiformats.CID``.

    Raises CBORError: over ``max_size`` bytes, malformed (the message names the MAX_ limit it
    broke), a link multiformats refuses, or non-canonical (``non_canonical`` set).
    """
    if len(data) > max_size:
        raise CBORError(f"{len(data)} bytes exceed the limit of {max_size}")
    try:
        scan_items(data, max_depth=max_depth, max_items=max_items)
    except CBORShapeError as exc:
        raise CBORError(f"malformed DAG-CBOR: {exc}") from exc
    try:
        value = dag_cbor.decode(data)
    except CBORDecodingError as exc:
        summary = _error_summary(exc)
        if "canonical" in str(exc) or "would have been enough" in str(exc):
            raise CBORError(f"non-canonical DAG-CBOR: {summary}", non_canonical=True) from exc
        raise CBORError(f"malformed DAG-CBOR: {summary}") from exc
    except (ValueError, KeyError, TypeError) as exc:  # multiformats refusing a link's bytes
        raise CBORError(f"malformed DAG-CBOR link: {exc}") from exc
    try:
        again = dag_cbor.encode(value)
    except (CBOREncodingError, TypeError, ValueError) as exc:
        message = f"DAG-CBOR value cannot be re-encoded: {exc}"
        raise CBORError(message, non_canonical=True) from exc
    if again != data:
        message = "non-canonical DAG-CBOR: re-encoding gives different bytes"
        raise CBORError(message, non_canonical=True)
    return value


class CBORShapeError(ValueError):
    """Raised by :func:`scan_items` when bytes are not one well-formed, bounded CBOR item."""


def scan_items(data: bytes, *, max_depth: int, max_items: int | None = None) -> None:
    """Check the item structure of ``data`` without building values.

    Raises CBORShapeError for truncation, bytes after the item, indefinite lengths and reserved
    heads, arrays or maps nested deeper than ``max_depth`` (empty ones open no level), and more
    than ``max_items`` array/map entries in all (when given). Messages name the MAX_ limit.
    """
    pos, n = 0, len(data)
    stack: list[int] = []  # items still to read in each open array/map (maps count 2 per entry)
    items = 0
    while True:
        if pos >= n:
            raise CBORShapeError("truncated: the data ends inside an item")
        major, info = data[pos] >> 5, data[pos] & 0x1F
        pos += 1
        if info < 24:
            arg = info
        elif info <= 27:
            size = 1 << (info - 24)
            if pos + size > n:
                raise CBORShapeError("truncated: the data ends inside an item head")
            arg = int.from_bytes(data[pos : pos + size], "big")
            pos += size
        else:
            raise CBORShapeError("indefinite-length or reserved item head (not DAG-CBOR)")
        if major in (2, 3):  # byte string, text string
            if arg > n - pos:
                raise CBORShapeError("truncated: a string runs past the end of the data")
            pos += arg
        elif major in (4, 5):  # array, map
            count = arg * (2 if major == 5 else 1)
            if count > n - pos:  # every item takes at least one byte
                raise CBORShapeError("truncated: a container claims more items than bytes remain")
            items += arg
            if max_items is not None and items > max_items:
                raise CBORShapeError(f"more than MAX_CBOR_ITEMS {max_items} items")
            if count:
                if len(stack) >= max_depth:
                    raise CBORShapeError(f"nested deeper than MAX_CBOR_DEPTH {max_depth}")
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
        raise CBORShapeError(f"{n - pos} bytes after the end of the item")


def _error_summary(exc: Exception) -> str:
    """The prose lines of a ``dag_cbor`` error, without its byte-dump lines (one-line messages)."""
    lines = [
        line.strip(" \\")
        for line in str(exc).splitlines()
        if line.strip() and "^" not in line and not line.strip().startswith(("At byte", "Key at"))
    ]
    return " ".join(lines)[:300] or type(exc).__name__
