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


def _reference(data: bytes) -> tuple[bool, object]:
    """What the decoder this one replaced accepted: ``dag_cbor`` decoding the scanned bytes,
    then re-encoding them to the very same bytes."""
    import dag_cbor
    from dag_cbor.decoding.err import CBORDecodingError
    from dag_cbor.encoding.err import CBOREncodingError

    from cnode import _cbor

    try:
        _cbor.scan_items(data, max_depth=limits.MAX_CBOR_DEPTH, max_items=limits.MAX_CBOR_ITEMS)
        value = dag_cbor.decode(data)
        return dag_cbor.encode(value) == data, value
    except (CBORDecodingError, CBOREncodingError, ValueError, KeyError, TypeError, IndexError):
        return False, None


def _ours(data: bytes) -> tuple[bool, object]:
    from cnode import _cbor

    try:
        value = _cbor.decode(
            data,
            max_size=limits.MAX_BLOCK_SIZE,
            max_depth=limits.MAX_CBOR_DEPTH,
            max_items=limits.MAX_CBOR_ITEMS,
        )
    except _cbor.CBORError:
        return False, None
    return True, value


def test_the_decoder_accepts_exactly_what_decode_and_re_encode_accepted() -> None:
    """The decoder refuses non-canonical bytes as it reads them (no re-encode): it must accept
    exactly the bytes ``dag_cbor`` decodes and re-encodes to themselves, with the same value,
    on random values (links included) and on every kind of damage to them."""
    import random

    import dag_cbor
    from dag_cbor import random as dag_cbor_random

    rng = random.Random(41)
    with dag_cbor_random.options(seed=41, max_len=5, max_bytes=24, max_chars=12):
        values = list(dag_cbor_random.rand_data(300, max_nesting=4))
    cases: list[bytes] = []
    for value in values:
        data = dag_cbor.encode(value)
        cases.append(data)
        for _ in range(6):
            damaged = bytearray(data)
            i = rng.randrange(len(damaged))
            kind = rng.randrange(4)
            if kind == 0:
                damaged[i] ^= 1 << rng.randrange(8)
            elif kind == 1:
                damaged[i] = rng.randrange(256)
            elif kind == 2:
                damaged.insert(i, rng.randrange(256))
            else:
                del damaged[i]
            cases.append(bytes(damaged))
    # Heads one size longer than needed, keys out of order or repeated, other floats/simples.
    cases += [bytes.fromhex(h) for h in ("1817", "190017", "1a000000ff", "1b00000000ffffffff")]
    cases += [bytes.fromhex(h) for h in ("a2616101616101", "a26161016162", "a2616201616101")]
    cases += [bytes.fromhex(h) for h in ("f93c00", "f7", "f0", "f818", "fb8000000000000000")]
    cases += [bytes.fromhex(h) for h in ("d82a40", "d90018", "d82a5800", "3bffffffffffffffff")]
    accepted = 0
    for data in cases:
        ok, value = _ours(data)
        ref_ok, ref_value = _reference(data)
        assert ok == ref_ok, f"{data.hex()}: ours {ok}, dag_cbor decode+re-encode {ref_ok}"
        assert value == ref_value, data.hex()
        accepted += ok
    assert 300 < accepted < len(cases)  # both kinds were exercised


def test_links_decode_straight_to_cids_and_only_in_their_one_binary_form() -> None:
    cid = compute_cid(b"x")
    data = encode({"l": cid})
    assert decode(data) == {"l": cid}
    raw = bytes(cid)
    # The same CID with a non-minimal varint (version 1 as 0x81 0x00): not its binary form.
    padded = b"\x81\x00" + raw[1:]
    body = b"\x00" + padded
    forged = b"\xa1\x61l\xd8\x2a" + bytes([0x58, len(body)]) + body
    with pytest.raises(CBORDecodeError, match="non-minimal varint"):
        decode(forged)
    with pytest.raises(CBORDecodeError, match="trailing bytes"):
        body = b"\x00" + raw + b"\x00"
        decode(b"\xa1\x61l\xd8\x2a" + bytes([0x58, len(body)]) + body)
