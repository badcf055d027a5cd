"""storage/_dagpb.py: the strict DAG-PB codec and UnixFS Data messages.

specs/manifest.md#unixfs-view.
"""

from __future__ import annotations

import pytest

from cnode.storage import compute_cid
from cnode.storage._cid import DAG_PB, RAW
from cnode.storage._dagpb import (
    UNIXFS_DIRECTORY,
    UNIXFS_FILE,
    DagPBError,
    PBLink,
    decode_node,
    encode_node,
    unixfs_directory,
    unixfs_file,
    unixfs_type,
)

LEAF = compute_cid(b"hello world", RAW)


def test_empty_directory_has_the_cid_every_ipfs_implementation_gives() -> None:
    # `ipfs object new unixfs-dir`, any UnixFS importer (CIDv0: QmUNLLsPACCz1vLxQVkXqqLX5R1X3...)
    data = encode_node([], unixfs_directory())
    assert data == bytes.fromhex("0a020801")
    assert str(compute_cid(data, DAG_PB)) == (
        "bafybeiczsscdsbs7ffqz55asqdf3smv6klcw3gofszvwlyarci47bgf354"
    )


def test_round_trip_links_first_sorted_by_name() -> None:
    links = [PBLink(LEAF, "b.txt", 11), PBLink(LEAF, "a.txt", 11)]
    data = encode_node(links, unixfs_directory())
    decoded, payload = decode_node(data)
    assert [link.name for link in decoded] == ["a.txt", "b.txt"]
    assert decoded[0] == PBLink(LEAF, "a.txt", 11)
    assert unixfs_type(payload) == UNIXFS_DIRECTORY
    assert data.index(b"a.txt") < data.index(b"b.txt") < data.rindex(b"\x0a\x02\x08\x01")


def test_file_node_records_filesize_and_each_blocksize() -> None:
    payload = unixfs_file([1 << 20, 5])
    # Type=2, filesize=1048581, blocksizes 1048576 and 5, unpacked (field 4 twice)
    assert payload == bytes.fromhex("0802") + bytes.fromhex("1885804020808040") + b"\x20\x05"
    assert unixfs_type(payload) == UNIXFS_FILE


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bytes.fromhex("0a020801") + encode_node([PBLink(LEAF, "a", 1)], None), "out-of-order"),
        (encode_node([PBLink(LEAF, "a", 1)], None)[:-3], "truncated"),
        (bytes.fromhex("0a0508"), "truncated"),
        (bytes.fromhex("0a0208010a020801"), "out-of-order"),
        (bytes.fromhex("0d00000000"), "wire type 5"),
        (bytes.fromhex("0a8200"), "non-minimal"),
        (bytes.fromhex("12020800"), "Hash, Name, Tsize in order"),
    ],
    ids=["data-before-links", "truncated-link", "truncated-data", "two-data",
         "fixed32", "non-minimal-length", "link-without-hash"],
)  # fmt: skip
def test_non_canonical_or_malformed_nodes_are_rejected(data: bytes, message: str) -> None:
    with pytest.raises(DagPBError, match=message):
        decode_node(data)


def test_unsorted_links_are_rejected() -> None:
    a, b = encode_node([PBLink(LEAF, "a", 1)], None), encode_node([PBLink(LEAF, "b", 1)], None)
    with pytest.raises(DagPBError, match="not sorted"):
        decode_node(b + a)
