"""Walking a block's links and framing CAR v1 streams: what a trustless gateway needs.

See specs/gateway.md#dag-scope. Pure functions on bytes (the network side is node/p2p/_gateway.py):

* :func:`block_links` — the links a DAG walk follows from one block, in order. A cnode manifest
  node links its own checkpoint only (layer pages, chunk pages, chunks, side-file chunks, the
  UnixFS view); its ``parent`` and the signed updates of its aggregation record are other DAGs
  and are not followed. A DAG-PB node links its PBLinks in order; other DAG-CBOR, every link in
  the value in encoded order; a raw block, nothing.
* :func:`is_unixfs_file` — whether ``dag-scope=entity`` means the whole sub-DAG (a UnixFS file)
  or the block alone (a directory, DAG-CBOR, raw).
* :func:`car_header`, :func:`car_section` and :func:`read_car` — CAR v1 framing. ``read_car``
  reads a whole (bounded) CAR held in memory and returns its sections unverified: the caller
  hashes each one.
"""

from __future__ import annotations

from typing import Any

from . import _cbor, limits
from ._cid import CID, DAG_CBOR, DAG_PB, VarintError, decode_cid_prefix, read_varint, varint
from ._dagpb import UNIXFS_FILE, DagPBError, decode_node, unixfs_type
from ._exceptions import CARError, InvalidCIDError, ManifestError, StorageError
from ._manifest import PartialLayer, parse_chunk_page, parse_layer_page, parse_root
from ._unixfs import recorded_root

# UnixFS Data.Type 0 ("Raw"): a leaf node holding file bytes; a file too, for entity scope.
_UNIXFS_RAW = 0


def _layer_links(layers: tuple[PartialLayer, ...]) -> list[CID]:
    out: list[CID] = []
    for layer in layers:
        out += layer.chunk_pages
        out += layer.chunks
    return out


def _value_links(value: Any, out: list[CID]) -> None:
    if isinstance(value, CID):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _value_links(item, out)
    elif isinstance(value, list):
        for item in value:
            _value_links(item, out)


def _cbor_links(data: bytes) -> list[CID]:
    try:
        root = parse_root(data)
    except ManifestError:
        pass
    else:
        out = list(root.layer_pages) + _layer_links(root.layers)
        for ref in root.meta.tokenizer_files.values():
            out += ref.chunks
        view = recorded_root(root.meta.extra)
        return out + ([view] if view is not None else [])
    try:
        return _layer_links(parse_layer_page(data))
    except ManifestError:
        pass
    try:
        return list(parse_chunk_page(data))
    except ManifestError:
        pass
    found: list[CID] = []
    _value_links(_cbor.decode(data), found)
    return found


def block_links(cid: CID, data: bytes) -> list[CID]:
    """The links a DAG walk follows from the block ``data`` named ``cid`` (verified by caller).

    Raises StorageError (DagPBError, CBORDecodeError...) when the block does not decode.
    """
    if cid.codec == DAG_PB:
        links, _ = decode_node(data)
        return [link.cid for link in links]
    if cid.codec == DAG_CBOR:
        return _cbor_links(data)
    return []


def is_unixfs_file(cid: CID, data: bytes) -> bool:
    """True for a DAG-PB UnixFS file node: its entity is every block under it."""
    if cid.codec != DAG_PB:
        return False
    try:
        _, payload = decode_node(data)
    except DagPBError:
        return False
    return unixfs_type(payload) in (UNIXFS_FILE, _UNIXFS_RAW)


def car_header(roots: list[CID]) -> bytes:
    """varint(len) + DAG-CBOR ``{"roots": roots, "version": 1}``."""
    header = _cbor.encode({"roots": roots, "version": 1})
    return varint(len(header)) + header


def car_section(cid: CID, data: bytes) -> bytes:
    """One CAR section: varint(len(cid) + len(data)) + cid + data."""
    raw = bytes(cid)
    return varint(len(raw) + len(data)) + raw + data


def read_car(data: bytes, max_sections: int) -> tuple[list[CID], list[tuple[CID, bytes]]]:
    """Roots and sections of a whole CAR v1 in ``data`` (blocks NOT verified here).

    Raises CARError naming what is wrong: truncation, a bad header, a bad CID, a section over
    MAX_CAR_SECTION_SIZE, or more than ``max_sections`` sections.
    """
    try:
        size, pos = read_varint(data, 0)
    except VarintError as exc:
        raise CARError(f"truncated CAR: no header ({exc})") from exc
    if not 0 < size <= limits.MAX_CAR_HEADER_SIZE or pos + size > len(data):
        raise CARError(f"truncated or oversized CAR header ({size} bytes)")
    try:
        header = _cbor.decode(data[pos : pos + size])
    except StorageError as exc:
        raise CARError(f"malformed CAR header: {exc}") from exc
    if not isinstance(header, dict) or header.get("version") != 1:
        raise CARError("malformed CAR header: not a CAR v1 header")
    roots = header.get("roots")
    if not isinstance(roots, list) or not all(isinstance(r, CID) for r in roots):
        raise CARError("malformed CAR header: roots must be a list of CIDs")
    pos += size
    sections: list[tuple[CID, bytes]] = []
    while pos < len(data):
        if len(sections) >= max_sections:
            raise CARError(f"CAR has more than the {max_sections} blocks asked for")
        try:
            size, pos = read_varint(data, pos)
        except VarintError as exc:
            raise CARError(f"truncated CAR: section {len(sections)} length ({exc})") from exc
        if not 0 < size <= limits.MAX_CAR_SECTION_SIZE:
            raise CARError(f"CAR section {len(sections)} of {size} bytes is out of bounds")
        if pos + size > len(data):
            raise CARError(
                f"truncated CAR: section {len(sections)} needs {size} bytes, "
                f"{len(data) - pos} left"
            )
        section = data[pos : pos + size]
        try:
            cid, used = decode_cid_prefix(section)
        except InvalidCIDError as exc:
            raise CARError(f"CAR section {len(sections)}: {exc}") from exc
        sections.append((cid, section[used:]))
        pos += size
    return list(roots), sections
