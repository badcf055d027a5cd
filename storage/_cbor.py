"""storage's DAG-CBOR: the shared codec of ``cnode/_cbor.py``, with links as :class:`CID`.

See specs/manifest.md#dag-cbor. Size is bounded first (MAX_BLOCK_SIZE, BlockTooLargeError); then
``cnode._cbor.decode`` (the codec ``auth`` runs too) checks item heads iteratively against
MAX_CBOR_DEPTH and MAX_CBOR_ITEMS, then decodes, accepting exactly one encoding of any value. Its
errors become CBORDecodeError or NonCanonicalCBORError here; links are read straight into our
:class:`CID` (``CID.parse``: the allowlist, and the one binary form) as they are decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import multiformats

from cnode import _cbor

from . import limits
from ._cid import CID, to_ipld
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


def _link(raw: bytes) -> CID:
    """A link's CID from its binary form (the allowlist applies; one binary form per CID)."""
    try:
        return CID.parse(raw)
    except InvalidCIDError as exc:
        raise _cbor.CBORError(f"link in DAG-CBOR: {exc}") from exc


def _decode_bounded(
    data: bytes | bytearray | memoryview, link: Callable[[bytes], Any] | None = None
) -> Any:
    """The shared codec under storage's limits; links as ``link`` makes them (default:
    ``multiformats.CID``, of any codec)."""
    links: dict[str, Callable[[bytes], Any]] = {} if link is None else {"link": link}
    return _cbor.decode(
        bytes(data),
        max_size=limits.MAX_BLOCK_SIZE,
        max_depth=limits.MAX_CBOR_DEPTH,
        max_items=limits.MAX_CBOR_ITEMS,
        **links,
    )


def foreign_links(data: bytes | bytearray | memoryview) -> list[tuple[str, str]] | None:
    """(CID text, codec name) of each link of a DAG-CBOR node, of any codec; None if not DAG-CBOR.

    Only to say what a block cnode refuses is (a CAR whose root is a dag-pb UnixFS node);
    nothing it returns is trusted or stored.
    """
    try:
        value = _decode_bounded(data)
    except _cbor.CBORError:
        return None
    out: list[tuple[str, str]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, multiformats.CID):
            out.append((item.encode("base32"), item.codec.name))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return out


def _too_large(size: int) -> BlockTooLargeError:
    return BlockTooLargeError(
        f"DAG-CBOR node of {size} bytes exceeds MAX_BLOCK_SIZE {limits.MAX_BLOCK_SIZE}"
    )


def encode(value: Any) -> bytes:
    """Canonical DAG-CBOR bytes of ``value`` (dicts with str keys, lists, CIDs, ints, floats...)."""
    try:
        data = _cbor.encode(_to_ipld(value, 0))
    except _cbor.CBORError as exc:
        raise StorageError(str(exc)) from exc
    if len(data) > limits.MAX_BLOCK_SIZE:
        raise _too_large(len(data))
    return data


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decode one strict canonical DAG-CBOR node; CIDs come back as :class:`CID`.

    Raises CBORDecodeError (malformed, truncated, too deep, too many items, bad link),
    NonCanonicalCBORError, or BlockTooLargeError (over MAX_BLOCK_SIZE). Size, depth and item
    count are checked before decoding.
    """
    if len(data) > limits.MAX_BLOCK_SIZE:
        raise _too_large(len(data))
    try:
        return _decode_bounded(data, _link)
    except _cbor.CBORError as exc:
        if exc.non_canonical:
            raise NonCanonicalCBORError(str(exc)) from exc
        raise CBORDecodeError(str(exc)) from exc
