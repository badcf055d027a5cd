"""The one walk over CBOR item heads that both ``storage`` and ``auth`` run on untrusted bytes.

``dag_cbor`` decodes recursively and allocates as it goes; before it sees bytes from a peer, this
walk checks the item structure iteratively (no recursion, no values built): exactly one item
fills the buffer, nothing is truncated, no indefinite lengths, nesting and item counts within
the caller's limits. Each layer turns :class:`CBORShapeError` into its own error type (it lives
here, under the layers, so neither imports the other).
"""

from __future__ import annotations

__all__ = ["CBORShapeError", "dag_cbor_error_summary", "scan_items"]


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
            items += arg
            if max_items is not None and items > max_items:
                raise CBORShapeError(f"more than MAX_CBOR_ITEMS {max_items} items")
            if count > n - pos:  # every item takes at least one byte
                raise CBORShapeError("truncated: a container claims more items than bytes remain")
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


def dag_cbor_error_summary(exc: Exception) -> str:
    """The prose lines of a ``dag_cbor`` error, without its byte-dump lines (one-line messages)."""
    lines = [
        line.strip(" \\")
        for line in str(exc).splitlines()
        if line.strip() and "^" not in line and not line.strip().startswith(("At byte", "Key at"))
    ]
    return " ".join(lines)[:300] or type(exc).__name__
