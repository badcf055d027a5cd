"""Strict, bounded DAG-CBOR for envelopes: one encode and one decode path.

See specs/identity.md#encoding. Before ``dag_cbor`` sees untrusted bytes,
``cnode._cbor_scan.scan_items`` (the walk ``storage`` runs too) checks the item heads iteratively
(no recursion) to bound nesting depth and item count and to make sure exactly one item fills the
buffer. ``dag_cbor`` then decodes (it refuses floats that are NaN or
Infinity, non-minimal integers, unsorted or duplicate map keys, and tags other than 42) and the
value is re-encoded and compared byte for byte, so exactly one encoding of any value is accepted.
``dag_cbor`` errors stay inside this module.
"""

from __future__ import annotations

from typing import Any

import dag_cbor
from dag_cbor.decoding.err import CBORDecodingError
from dag_cbor.encoding.err import CBOREncodingError

from cnode._cbor_scan import CBORShapeError, dag_cbor_error_summary, scan_items

from . import limits


class CBORError(ValueError):
    """Internal: bytes are not bounded canonical DAG-CBOR (callers turn it into their error)."""


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
    try:
        scan_items(data, max_depth=limits.MAX_CBOR_DEPTH, max_items=limits.MAX_CBOR_ITEMS)
    except CBORShapeError as exc:
        raise CBORError(str(exc)) from exc
    try:
        value = dag_cbor.decode(data)
    except CBORDecodingError as exc:
        raise CBORError(f"not DAG-CBOR: {dag_cbor_error_summary(exc)}") from exc
    except (ValueError, KeyError, TypeError) as exc:  # multiformats refusing a link's bytes
        raise CBORError(f"bad link in DAG-CBOR: {exc}") from exc
    if encode(value) != data:
        raise CBORError("non-canonical DAG-CBOR: re-encoding gives different bytes")
    return value
