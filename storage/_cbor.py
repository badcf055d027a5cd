"""Strict canonical DAG-CBOR: the one encode and one decode path for structured blocks.

See specs/manifest.md#dag-cbor. Size is bounded first; then ``cnode._cbor_scan.scan_items`` (the
walk ``auth`` runs too) checks the item heads iteratively (no recursion, no values built) to
bound nesting depth and to make sure exactly one complete item fills the bytes. Only then does
the ``dag_cbor`` package decode (it refuses NaN/Infinity, 16/32-bit floats, non-minimal
integers, unsorted or non-string map keys and tags other than 42); the result is re-encoded and
the bytes compared, so exactly one encoding of any value is accepted. Errors of ``dag_cbor`` and
``multiformats`` stay inside this module: they become CBORDecodeError.
"""

from __future__ import annotations

from typing import Any

import dag_cbor
import multiformats
from dag_cbor.decoding.err import CBORDecodingError
from dag_cbor.encoding.err import CBOREncodingError

from cnode._cbor_scan import CBORShapeError, dag_cbor_error_summary, scan_items

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
    """Links to :class:`CID`; recursion is bounded because ``scan_items`` bounded the depth."""
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
    try:
        scan_items(raw, max_depth=limits.MAX_CBOR_DEPTH)
    except CBORShapeError as exc:
        raise CBORDecodeError(f"malformed DAG-CBOR: {exc}") from exc
    try:
        value = dag_cbor.decode(raw)
    except CBORDecodingError as exc:
        first = dag_cbor_error_summary(exc)
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
