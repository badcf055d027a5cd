"""Strict, bounded DAG-CBOR for envelopes: one encode and one decode path.

See specs/identity.md#encoding. Before ``dag_cbor`` sees untrusted bytes, :func:`_scan` walks the
item headers iteratively (no recursion) to bound nesting depth and item count and to make sure
exactly one item fills the buffer. ``dag_cbor`` then decodes (it refuses floats that are NaN or
Infinity, non-minimal integers, unsorted or duplicate map keys, and tags other than 42) and the
value is re-encoded and compared byte for byte, so exactly one encoding of any value is accepted.
``dag_cbor`` errors stay inside this module.
"""

from __future__ import annotations

from typing import Any

import dag_cbor
from dag_cbor.decoding.err import CBORDecodingError
from dag_cbor.encoding.err import CBOREncodingError

from . import limits


class CBORError(ValueError):
    """Internal: bytes are not bounded canonical DAG-CBOR (callers turn it into their error)."""


def _scan(data: bytes) -> None:
    """Check the item structure of ``data`` without building values.

    Raises CBORError for truncation, trailing bytes, indefinite lengths, nesting deeper than
    MAX_CBOR_DEPTH or more than MAX_CBOR_ITEMS items.
    """
    pos, n = 0, len(data)
    # Each stack entry: items still to read in an open array/map (maps count 2 per entry).
    stack: list[int] = []
    items = 0
    while True:
        if pos >= n:
            raise CBORError("truncated: the data ends inside an item")
        initial = data[pos]
        pos += 1
        major, info = initial >> 5, initial & 0x1F
        if info < 24:
            arg = info
        elif info <= 27:
            size = 1 << (info - 24)
            if pos + size > n:
                raise CBORError("truncated: the data ends inside an item header")
            arg = int.from_bytes(data[pos : pos + size], "big")
            pos += size
        else:
            raise CBORError("indefinite-length or reserved item (not DAG-CBOR)")
        if major in (2, 3):  # byte string, text string
            if arg > n - pos:
                raise CBORError("truncated: a string runs past the end of the data")
            pos += arg
        elif major in (4, 5):  # array, map
            count = arg * (2 if major == 5 else 1)
            items += arg
            if items > limits.MAX_CBOR_ITEMS:
                raise CBORError(f"more than MAX_CBOR_ITEMS {limits.MAX_CBOR_ITEMS} items")
            if count > n - pos:  # every item takes at least one byte
                raise CBORError("truncated: a container claims more items than bytes remain")
            if count:
                if len(stack) + 1 > limits.MAX_CBOR_DEPTH:
                    raise CBORError(f"nested deeper than MAX_CBOR_DEPTH {limits.MAX_CBOR_DEPTH}")
                stack.append(count)
                continue
        elif major == 6:  # tag: the tagged item follows as the next item
            continue
        # A complete item ended: pop finished containers.
        while stack:
            stack[-1] -= 1
            if stack[-1]:
                break
            stack.pop()
        if not stack:
            break
    if pos != n:
        raise CBORError(f"{n - pos} bytes after the end of the item")


def _summary(exc: Exception) -> str:
    """The prose lines of a dag_cbor error, without its byte-dump lines, for one-line messages."""
    lines = [
        line.strip(" \\")
        for line in str(exc).splitlines()
        if line.strip() and "^" not in line and not line.strip().startswith("At byte")
    ]
    return " ".join(lines)[:300] or type(exc).__name__


def encode(value: Any) -> bytes:
    """Canonical DAG-CBOR bytes of ``value``; CBORError if it holds kinds DAG-CBOR cannot carry."""
    try:
        data = dag_cbor.encode(value)
    except (CBOREncodingError, TypeError, ValueError) as exc:
        raise CBORError(f"cannot encode as DAG-CBOR: {exc}") from exc
    assert isinstance(data, bytes)
    return data


def decode(data: bytes, *, max_size: int) -> Any:
    """Decode one bounded, canonical DAG-CBOR item; CBORError says what is wrong."""
    if len(data) > max_size:
        raise CBORError(f"{len(data)} bytes exceed the limit of {max_size}")
    _scan(data)
    try:
        value = dag_cbor.decode(data)
    except CBORDecodingError as exc:
        raise CBORError(f"not DAG-CBOR: {_summary(exc)}") from exc
    except (ValueError, KeyError, TypeError) as exc:  # multiformats refusing a link's bytes
        raise CBORError(f"bad link in DAG-CBOR: {exc}") from exc
    if encode(value) != data:
        raise CBORError("non-canonical DAG-CBOR: re-encoding gives different bytes")
    return value
