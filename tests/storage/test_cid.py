from __future__ import annotations

import hashlib

import pytest
from multiformats import CID as MFCID
from multiformats import multihash

from cnode.storage import (
    CID,
    DAG_CBOR,
    RAW,
    BlockMismatchError,
    BlockTooLargeError,
    InvalidCIDError,
    compute_cid,
    limits,
    verify_block,
)

# IPFS vectors: `ipfs add --raw-leaves --cid-version 1` of these bytes.
HELLO = "bafkreifzjut3te2nhyekklss27nh3k72ysco7y32koao5eei66wof36n5e"  # b"hello world"
EMPTY = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"  # b""


def test_raw_cid_matches_ipfs_vectors() -> None:
    assert str(compute_cid(b"hello world")) == HELLO
    assert str(compute_cid(b"")) == EMPTY


@pytest.mark.parametrize("data", [b"", b"hello world\n", bytes(range(256)) * 4000])
def test_raw_cid_matches_multiformats(data: bytes) -> None:
    expected = MFCID("base32", 1, "raw", multihash.wrap(hashlib.sha256(data).digest(), "sha2-256"))
    assert str(compute_cid(data)) == str(expected)
    assert bytes(compute_cid(data)) == bytes(expected)


def test_round_trips_and_prefixes() -> None:
    raw = compute_cid(b"x")
    cbor = compute_cid(b"\xa0", DAG_CBOR)
    assert str(raw).startswith("bafk") and str(cbor).startswith("bafy")
    for cid in (raw, cbor):
        assert CID.parse(str(cid)) == cid
        assert CID.parse(bytes(cid)) == cid
    assert raw.codec == RAW and len(raw.digest) == 32 and raw.version == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG", "CIDv0 is not supported"),
        ("zb2rhj7crUKTQYRGCRATFaQ6YFLTde2YzdqbbhAASkL9uRDXn", "must start with 'b'"),
        (HELLO.upper().replace("B", "b", 1), "lower-case"),
        (HELLO[:-4], "bad base32"),
        (bytes([1, 0x55, 0x12, 32]) + bytes(31), "truncated CID digest"),
        ("b!!!!", "bad base32"),
        (bytes([2, 0x55, 0x12, 32]) + bytes(32), "unknown CID version 2"),
        (bytes([1, 0xA9, 0x02, 0x12, 32]) + bytes(32), "codec 0x129 is not allowed"),
        (bytes([1, 0x55, 0x13, 64]) + bytes(64), "hash 0x13 is not allowed"),
        (bytes([1, 0x55, 0x12, 20]) + bytes(20), "digest size 20"),
        (bytes([1, 0x55, 0x12, 32]) + bytes(33), "trailing bytes"),
        (bytes([0x81, 0x00, 0x55, 0x12, 32]) + bytes(32), "non-minimal varint"),
    ],
)
def test_bad_cids_are_rejected(value: str | bytes, message: str) -> None:
    with pytest.raises(InvalidCIDError, match=message):
        CID.parse(value)


def test_verify_block() -> None:
    cid = compute_cid(b"abc")
    verify_block(cid, b"abc")
    with pytest.raises(BlockMismatchError, match=str(cid)):
        verify_block(cid, b"abd")
    with pytest.raises(BlockTooLargeError, match="MAX_BLOCK_SIZE"):
        compute_cid(bytes(limits.MAX_BLOCK_SIZE + 1))
