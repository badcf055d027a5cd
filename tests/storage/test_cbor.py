from __future__ import annotations

import pytest

from cnode.storage import (
    BlockTooLargeError,
    CBORDecodeError,
    NonCanonicalCBORError,
    compute_cid,
    limits,
)
from cnode.storage._cbor import decode, encode


def test_round_trip_with_links() -> None:
    cid = compute_cid(b"x")
    value = {"b": [1, -2, 2.5, None, True, b"\x00", "s"], "a": cid, "c": {"z": 1, "aa": 2}}
    data = encode(value)
    assert decode(data) == value
    assert encode(decode(data)) == data
    # keys sort by length first, then bytes (DAG-CBOR canonical order)
    assert data.index(b"aa") < data.index(b"z")


@pytest.mark.parametrize(
    ("hex_bytes", "error", "message"),
    [
        ("a2616201616101", NonCanonicalCBORError, "canonical order"),  # unsorted keys
        ("1801", NonCanonicalCBORError, "would have been enough"),  # 1 in two bytes
        ("fb7ff8000000000000", CBORDecodeError, "NaN"),
        ("fb7ff0000000000000", CBORDecodeError, "Infinity"),
        ("fa3fc00000", CBORDecodeError, "additional info 26"),  # 32-bit float
        ("a1016161", CBORDecodeError, "string type"),  # integer map key
        ("81", CBORDecodeError, "truncated"),  # truncated array
        ("fb3ff80000", CBORDecodeError, "truncated"),  # truncated float
        ("c2420001", CBORDecodeError, "tag 42"),  # bignum tag
        ("d82a4100", CBORDecodeError, "link"),  # malformed CID in a link
        ("0102", CBORDecodeError, "malformed"),  # two items
    ],
)
def test_bad_cbor(hex_bytes: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        decode(bytes.fromhex(hex_bytes))


def test_depth_bounded() -> None:
    assert decode(b"\x81" * limits.MAX_CBOR_DEPTH + b"\x01") is not None
    assert decode(b"\x81" * limits.MAX_CBOR_DEPTH + b"\x80") is not None  # [] opens no level
    with pytest.raises(CBORDecodeError, match="MAX_CBOR_DEPTH"):
        decode(b"\x81" * (limits.MAX_CBOR_DEPTH + 1) + b"\x01")
    with pytest.raises(CBORDecodeError, match="MAX_CBOR_DEPTH"):  # maps count the same
        decode(b"\xa1\x61k" * (limits.MAX_CBOR_DEPTH + 1) + b"\x01")
    with pytest.raises(CBORDecodeError, match="MAX_CBOR_DEPTH"):
        decode(b"\x81" * 5000 + b"\x01")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x81" * (limits.MAX_CBOR_DEPTH + 1) + b"\x01", "MAX_CBOR_DEPTH"),
        (b"\x81" * 500_000 + b"\x01", "MAX_CBOR_DEPTH"),  # would recurse 500k deep
        (b"\x9b" + (1 << 62).to_bytes(8, "big"), "more items than bytes"),  # 2^62-item array
        (b"\x5a\xff\xff\xff\xff", "runs past the end"),
        (b"\x9f\x01\xff", "indefinite-length"),
        (b"\x01\x01", "1 bytes after the end"),
        (b"", "truncated"),
    ],
)
def test_structure_checked_before_dag_cbor_decodes(
    monkeypatch: pytest.MonkeyPatch, data: bytes, message: str
) -> None:
    import dag_cbor

    def must_not_run(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("dag_cbor.decode ran on bytes the scan should have refused")

    monkeypatch.setattr(dag_cbor, "decode", must_not_run)
    with pytest.raises(CBORDecodeError, match=message):
        decode(data)


def test_size_bounded() -> None:
    with pytest.raises(BlockTooLargeError, match="MAX_BLOCK_SIZE"):
        decode(b"\x5a" + (limits.MAX_BLOCK_SIZE).to_bytes(4, "big") + bytes(limits.MAX_BLOCK_SIZE))
    with pytest.raises(BlockTooLargeError):
        encode({"a": bytes(limits.MAX_BLOCK_SIZE)})


def test_links_outside_the_allowlist_rejected() -> None:
    import hashlib

    import dag_cbor
    from multiformats import CID as MFCID
    from multiformats import multihash

    digest = multihash.wrap(hashlib.sha256(b"x").digest(), "sha2-256")
    for codec in ("dag-json", "git-raw"):
        data = dag_cbor.encode({"l": MFCID("base32", 1, codec, digest)})
        with pytest.raises(CBORDecodeError, match="not allowed"):
            decode(data)
    md5ish = multihash.wrap(hashlib.sha512(b"x").digest(), "sha2-512")
    with pytest.raises(CBORDecodeError, match="hash 0x13 is not allowed"):
        decode(dag_cbor.encode([MFCID("base32", 1, "raw", md5ish)]))
    v0 = MFCID("base58btc", 0, "dag-pb", digest)
    with pytest.raises(CBORDecodeError, match="CIDv0"):
        decode(dag_cbor.encode([v0]))
