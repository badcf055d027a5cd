"""Strict, bounded, canonical DAG-CBOR: the one encoder and decoder of cnode.

``storage`` (manifests, CAR headers) and ``auth`` (envelopes) both run on it; it lives here,
under the layers, so neither imports the other. Each layer passes its own limits and turns
:class:`CBORError` into its own error type (``storage/_cbor.py`` also maps links to its CIDs).

Decoding is this module's own (:func:`decode`); ``dag_cbor`` only encodes. Before a value is
built, :func:`scan_items` checks the item structure iteratively (no recursion, no values built):
exactly one item fills the buffer, nothing is truncated, no indefinite lengths, nesting and item
counts within the caller's limits. The decoder then reads the items (its recursion is bounded by
the scan's depth) and refuses, as it reads, every encoding that is not the one canonical DAG-CBOR
encoding of its value: a head longer than needed, map keys that are not strings, not in
length-then-bytes order or repeated, floats other than 64-bit and NaN/Infinity, simple values
other than false/true/null, tags other than 42, a link whose bytes are not the one binary form of
its CID. So exactly one encoding of any value is accepted, as if the value were re-encoded and
the bytes compared. (``dag_cbor``'s decoder, which this replaced, took ~30 ms for a 64-link
update manifest: ``multiformats`` checks every argument's type at run time while it builds each
link. ``tests/storage/test_cbor.py`` holds this decoder to ``dag_cbor``'s decode-and-re-encode on
random and mutated values.)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import dag_cbor
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


def _multiformats_link(raw: bytes) -> Any:
    """A link as ``multiformats.CID`` (what ``dag_cbor`` gave): for callers that name none."""
    import multiformats  # only those callers pay for it (storage and auth name their own)

    try:
        cid = multiformats.CID.decode(raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise CBORError(f"malformed DAG-CBOR link: {exc}") from exc
    if bytes(cid) != raw:
        raise CBORError(
            "non-canonical DAG-CBOR link: not the CID's binary form", non_canonical=True
        )
    return cid


def decode(
    data: bytes,
    *,
    max_size: int,
    max_depth: int,
    max_items: int,
    link: Callable[[bytes], Any] = _multiformats_link,
) -> Any:
    """Decode one bounded, canonical DAG-CBOR item.

    ``link(raw)`` makes a link's value from the CID's binary form (the tag-42 bytes after their
    0x00 prefix); it MUST refuse (CBORError) bytes that are not exactly one CID in its one binary
    form. Without it, links come back as ``multiformats.CID``.

    Raises CBORError: over ``max_size`` bytes, malformed (the message names the MAX_ limit it
    broke), a link ``link`` refuses, or non-canonical (``non_canonical`` set).
    """
    if len(data) > max_size:
        raise CBORError(f"{len(data)} bytes exceed the limit of {max_size}")
    try:
        scan_items(data, max_depth=max_depth, max_items=max_items)
    except CBORShapeError as exc:
        raise CBORError(f"malformed DAG-CBOR: {exc}") from exc
    # The scan proved the heads well formed, every length within the data and the nesting
    # within max_depth: the reader below indexes without bounds checks and recurses safely.
    value, _end = _Reader(bytes(data), link).item(0)
    return value


# The smallest argument each head length may carry (a shorter head would hold it otherwise).
_MIN_ARG = {24: 24, 25: 1 << 8, 26: 1 << 16, 27: 1 << 32}
_DOUBLE = struct.Struct(">d")


def _non_canonical(message: str) -> CBORError:
    return CBORError(f"non-canonical DAG-CBOR: {message}", non_canonical=True)


def _malformed(message: str) -> CBORError:
    return CBORError(f"malformed DAG-CBOR: {message}")


class _Reader:
    """Reads the items of bytes :func:`scan_items` accepted, refusing non-canonical ones."""

    __slots__ = ("data", "link")

    def __init__(self, data: bytes, link: Callable[[bytes], Any]) -> None:
        self.data = data
        self.link = link

    def _arg(self, info: int, pos: int) -> tuple[int, int]:
        """The head's argument for additional info 24..27 at ``pos``, which must be minimal."""
        size = 1 << (info - 24)
        arg = int.from_bytes(self.data[pos : pos + size], "big")
        if arg < _MIN_ARG[info]:
            fewer = next(
                n for n, bound in ((0, 24), (1, 1 << 8), (2, 1 << 16), (4, 1 << 32)) if arg < bound
            )
            raise _non_canonical(
                f"argument {arg} in {size} extra head bytes where {fewer} would have been enough"
            )
        return arg, pos + size

    def item(self, pos: int) -> tuple[Any, int]:
        """The item at ``pos`` and the position after it."""
        data = self.data
        major, info = data[pos] >> 5, data[pos] & 0x1F
        pos += 1
        if major == 7:
            return self._simple(info, pos)
        arg, pos = (info, pos) if info < 24 else self._arg(info, pos)
        if major == 0:
            return arg, pos
        if major == 1:
            return -1 - arg, pos
        if major == 2:
            return data[pos : pos + arg], pos + arg
        if major == 3:
            return self._text(pos, arg), pos + arg
        if major == 4:
            out: list[Any] = []
            for _ in range(arg):
                value, pos = self.item(pos)
                out.append(value)
            return out, pos
        if major == 5:
            return self._map(pos, arg)
        return self._link(pos, arg)  # major 6: a tag

    def _text(self, pos: int, size: int) -> str:
        try:
            return self.data[pos : pos + size].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _malformed(f"string is not UTF-8 ({exc.reason})") from exc

    def _simple(self, info: int, pos: int) -> tuple[Any, int]:
        if info == 27:
            value = _DOUBLE.unpack_from(self.data, pos)[0]
            if math.isnan(value):
                raise _malformed("NaN is not allowed in DAG-CBOR")
            if math.isinf(value):
                raise _malformed("Infinity is not allowed in DAG-CBOR")
            return value, pos + 8
        if info == 20:
            return False, pos
        if info == 21:
            return True, pos
        if info == 22:
            return None, pos
        if info >= 24:
            raise _malformed(f"additional info {info} for major type 7 (only 64-bit floats)")
        raise _malformed(f"simple value {info} (only false, true, null)")

    def _map(self, pos: int, count: int) -> tuple[dict[str, Any], int]:
        data = self.data
        out: dict[str, Any] = {}
        previous = b""
        for i in range(count):
            major, info = data[pos] >> 5, data[pos] & 0x1F
            if major != 3:
                raise _malformed(f"map key of major type {major}: keys must be of string type")
            size, pos = (info, pos + 1) if info < 24 else self._arg(info, pos + 1)
            key = data[pos : pos + size]
            # Canonical order: shorter keys first, then bytewise; equal means a repeated key.
            if i and (len(key), key) <= (len(previous), previous):
                if key == previous:
                    raise _malformed(f"repeated map key {key[:40]!r}")
                raise _non_canonical(f"map key {key[:40]!r} out of canonical order")
            text = self._text(pos, size)
            value, pos = self.item(pos + size)
            out[text] = value
            previous = key
        return out, pos

    def _link(self, pos: int, tag: int) -> tuple[Any, int]:
        if tag != 42:
            raise _malformed(f"tag {tag}: the only tag in DAG-CBOR is tag 42 (links)")
        data = self.data
        major, info = data[pos] >> 5, data[pos] & 0x1F
        if major != 2:
            raise _malformed(f"tag 42 link of major type {major}, not a byte string")
        size, pos = (info, pos + 1) if info < 24 else self._arg(info, pos + 1)
        if not size or data[pos] != 0:
            raise _malformed("link bytes must start with the identity multibase prefix 0x00")
        return self.link(data[pos + 1 : pos + size]), pos + size


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
