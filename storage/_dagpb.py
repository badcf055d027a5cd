"""A small strict DAG-PB codec and the UnixFS ``Data`` message it carries.

See specs/manifest.md#unixfs-view. DAG-PB (https://ipld.io/specs/codecs/dag-pb/spec/) is one
protobuf message::

    message PBLink { optional bytes Hash = 1; optional string Name = 2; optional uint64 Tsize = 3; }
    message PBNode { repeated PBLink Links = 2; optional bytes Data = 1; }

Written canonically: every link (field 2) before the data (field 1), link fields in field order,
links sorted by name bytes (stable), varints minimal. The decoder accepts exactly that form, so
one node has one encoding, and it never allocates more than the block it was given.

UnixFS (https://specs.ipfs.tech/unixfs/) puts a ``Data`` message in PBNode.Data::

    message Data { required DataType Type = 1; optional bytes Data = 2;
                   optional uint64 filesize = 3; repeated uint64 blocksizes = 4; ... }

Only what cnode writes is produced here: ``Directory`` (Type 1, nothing else) and ``File``
(Type 2, filesize and one unpacked blocksizes entry per link, no inline data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._cid import CID, VarintError, decode_cid_prefix, read_varint, varint
from ._exceptions import InvalidCIDError, StorageError

# UnixFS Data.Type values.
UNIXFS_DIRECTORY = 1
UNIXFS_FILE = 2


class DagPBError(StorageError):
    """Raised by the DAG-PB decoder when a node is malformed or not in canonical form."""


@dataclass(frozen=True, slots=True)
class PBLink:
    """One link: the child's CID, its name ("" in a file node) and its cumulative size."""

    cid: CID
    name: str
    tsize: int


def _varint(n: int) -> bytes:
    if n < 0:
        raise ValueError("protobuf varints here are unsigned")
    return varint(n)  # protobuf's base-128 varint is the multiformats one


def _field_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def encode_node(links: Sequence[PBLink], data: bytes | None) -> bytes:
    """Canonical DAG-PB bytes: links sorted by name (stable), then ``data`` if given."""
    out = bytearray()
    for link in sorted(links, key=lambda lk: lk.name.encode("utf-8")):
        body = (
            _field_bytes(1, bytes(link.cid))
            + _field_bytes(2, link.name.encode("utf-8"))
            + _field_varint(3, link.tsize)
        )
        out += _field_bytes(2, body)
    if data is not None:
        out += _field_bytes(1, data)
    return bytes(out)


def unixfs_directory() -> bytes:
    """The UnixFS Data message of a plain directory: ``Type = Directory``."""
    return _field_varint(1, UNIXFS_DIRECTORY)


def unixfs_file(blocksizes: Sequence[int]) -> bytes:
    """The UnixFS Data message of a file node whose children hold ``blocksizes`` bytes each."""
    out = _field_varint(1, UNIXFS_FILE) + _field_varint(3, sum(blocksizes))
    for size in blocksizes:
        out += _field_varint(4, size)
    return out


# -- decoding ------------------------------------------------------------------------------


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    try:
        return read_varint(data, pos)
    except VarintError as exc:
        raise DagPBError(f"{exc} in DAG-PB node") from exc


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs; only varint (0) and length-delimited (2) wire types."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise DagPBError("truncated field in DAG-PB node")
            out.append((number, data[pos : pos + size]))
            pos += size
        else:
            raise DagPBError(f"DAG-PB field {number} has unsupported wire type {wire}")
    return out


def _decode_link(body: bytes) -> PBLink:
    fields = _fields(body)
    numbers = [n for n, _ in fields]
    if numbers != [1, 2, 3]:
        raise DagPBError(f"DAG-PB link must have Hash, Name, Tsize in order, got fields {numbers}")
    raw_cid, raw_name, tsize = (v for _, v in fields)
    if not isinstance(raw_cid, bytes) or not isinstance(raw_name, bytes):
        raise DagPBError("DAG-PB link Hash and Name must be bytes")
    if not isinstance(tsize, int):
        raise DagPBError("DAG-PB link Tsize must be a varint")
    try:
        cid, used = decode_cid_prefix(raw_cid)
    except InvalidCIDError as exc:
        raise DagPBError(f"DAG-PB link: {exc}") from exc
    if used != len(raw_cid):
        raise DagPBError("DAG-PB link: bytes after the CID")
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DagPBError("DAG-PB link name is not UTF-8") from exc
    return PBLink(cid, name, tsize)


def decode_node(data: bytes) -> tuple[list[PBLink], bytes | None]:
    """Decode a canonical DAG-PB node (as cnode writes them); raise DagPBError otherwise."""
    links: list[PBLink] = []
    payload: bytes | None = None
    for number, value in _fields(bytes(data)):
        if number == 2 and payload is None and isinstance(value, bytes):
            links.append(_decode_link(value))
        elif number == 1 and payload is None and isinstance(value, bytes):
            payload = value
        else:
            raise DagPBError(f"DAG-PB node: unexpected or out-of-order field {number}")
    names = [link.name.encode("utf-8") for link in links]
    if names != sorted(names):
        raise DagPBError("DAG-PB node: links are not sorted by name")
    if encode_node(links, payload) != bytes(data):
        raise DagPBError("DAG-PB node is not in canonical form")
    return links, payload


def unixfs_type(payload: bytes | None) -> int | None:
    """The UnixFS Data.Type of a node's payload, or None if it carries none."""
    if not payload:
        return None
    try:
        fields = _fields(payload)
    except DagPBError:
        return None
    if not fields or fields[0][0] != 1 or not isinstance(fields[0][1], int):
        return None
    return fields[0][1]
