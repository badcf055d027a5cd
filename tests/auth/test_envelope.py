import math
import random

import dag_cbor
import pytest
from dag_cbor import random as dag_cbor_random

from cnode.auth import (
    DOMAIN,
    PAYLOAD_TYPES,
    BadSignature,
    EncodeError,
    Identity,
    MalformedEnvelope,
    UnknownPayloadType,
    WrongSigner,
    open_envelope,
    seal,
)
from cnode.auth.limits import MAX_CBOR_DEPTH, MAX_ENVELOPE_SIZE

ANNOUNCE = "cnode/announce/v1"


@pytest.fixture(scope="module")
def alice() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def bob() -> Identity:
    return Identity.generate()


def _fields(data: bytes) -> dict:
    value = dag_cbor.decode(data)
    assert isinstance(value, dict)
    return dict(value)


def test_seal_open_roundtrip(alice: Identity) -> None:
    payload = {"run": "r", "round": 3, "cids": ["x", "y"], "blob": b"\x00\x01", "none": None}
    data = seal(alice, ANNOUNCE, payload)
    opened = open_envelope(data, expected_type=ANNOUNCE, expected_signer=alice.peer_id_str)
    assert opened.payload == payload
    assert opened.signer == alice.peer_id_str
    assert opened.payload_type == ANNOUNCE
    assert open_envelope(data, expected_type=ANNOUNCE).signer == alice.peer_id_str


def test_contract_payload_types_known() -> None:
    for name in (
        "cnode/hf-binding/v1",
        "cnode/access-token/v1",
        "cnode/announce/v1",
        "cnode/update-header/v1",
        "cnode/partition-result/v1",
        "cnode/score-record/v1",
        "cnode/run-state/v1",
        "cnode/request/v1",
    ):
        assert name in PAYLOAD_TYPES
    # Types nothing sends are not accepted either (issue 15): one line per type that is real.
    assert len(PAYLOAD_TYPES) == 8


def test_signature_covers_domain_type_signer_payload(alice: Identity) -> None:
    data = seal(alice, ANNOUNCE, {"n": 1})
    fields = _fields(data)
    body = {"payload": fields["payload"], "signer": fields["signer"], "type": fields["type"]}
    signed = DOMAIN + dag_cbor.encode(body)
    assert alice.public_key.verify(signed, fields["sig"])
    assert not alice.public_key.verify(dag_cbor.encode(body), fields["sig"])  # domain matters


def test_tampered_payload_is_bad_signature(alice: Identity) -> None:
    fields = _fields(seal(alice, ANNOUNCE, {"n": 1}))
    fields["payload"] = {"n": 2}
    with pytest.raises(BadSignature, match=f"{ANNOUNCE} from {alice.peer_id_str}: signature"):
        open_envelope(dag_cbor.encode(fields), expected_type=ANNOUNCE)


def test_flipped_signature_bit_is_bad_signature(alice: Identity) -> None:
    fields = _fields(seal(alice, ANNOUNCE, {"n": 1}))
    sig = bytearray(fields["sig"])
    sig[0] ^= 1
    fields["sig"] = bytes(sig)
    with pytest.raises(BadSignature, match="does not verify"):
        open_envelope(dag_cbor.encode(fields), expected_type=ANNOUNCE)


def test_type_swapped_after_signing_is_bad_signature(alice: Identity) -> None:
    # Domain separation: a signed announce cannot be relabelled as an update header.
    fields = _fields(seal(alice, ANNOUNCE, {"n": 1}))
    fields["type"] = "cnode/update-header/v1"
    with pytest.raises(BadSignature):
        open_envelope(dag_cbor.encode(fields), expected_type="cnode/update-header/v1")


def test_signer_swapped_is_bad_signature(alice: Identity, bob: Identity) -> None:
    fields = _fields(seal(alice, ANNOUNCE, {"n": 1}))
    fields["signer"] = bob.peer_id.to_bytes()
    with pytest.raises(BadSignature, match=bob.peer_id_str):
        open_envelope(dag_cbor.encode(fields), expected_type=ANNOUNCE)


def test_wrong_signer(alice: Identity, bob: Identity) -> None:
    data = seal(alice, ANNOUNCE, {"n": 1})
    with pytest.raises(
        WrongSigner, match=f"signed by {alice.peer_id_str}, expected {bob.peer_id_str}"
    ):
        open_envelope(data, expected_type=ANNOUNCE, expected_signer=bob.peer_id_str)


def test_unexpected_and_unknown_types(alice: Identity) -> None:
    data = seal(alice, ANNOUNCE, {"n": 1})
    with pytest.raises(UnknownPayloadType, match="where 'cnode/run-state/v1' was expected"):
        open_envelope(data, expected_type="cnode/run-state/v1")
    fields = _fields(data)
    fields["type"] = "cnode/evil/v1"
    with pytest.raises(UnknownPayloadType, match="unknown payload type 'cnode/evil/v1'"):
        open_envelope(dag_cbor.encode(fields), expected_type=ANNOUNCE)
    with pytest.raises(UnknownPayloadType, match="cannot seal unknown payload type"):
        seal(alice, "cnode/evil/v1", {})


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "truncated"),
        (b"\xa4", "truncated"),
        (b"\xff", "indefinite"),
        (b"\x9f\x01\xff", "indefinite"),
        (dag_cbor.encode([1, 2]), "expected keys payload/sig/signer/type"),
        (dag_cbor.encode({"a": 1}), "expected keys"),
        (dag_cbor.encode(1) + b"\x00", "1 bytes after the end"),
        (b"\x5a\xff\xff\xff\xff", "truncated: a string runs past"),
        (b"\x98\x10\x00", "truncated: a container claims"),
    ],
)
def test_malformed_bytes(data: bytes, why: str) -> None:
    with pytest.raises(MalformedEnvelope, match=why):
        open_envelope(data, expected_type=ANNOUNCE)


def test_non_canonical_encoding_refused(alice: Identity) -> None:
    data = seal(alice, ANNOUNCE, {"n": 1})
    # The same map with a non-minimal length header for its first key ("sig": 0x63 -> 0x78 0x03).
    assert data[1] == 0x63
    stretched = data[:1] + b"\x78\x03" + data[2:]
    with pytest.raises(MalformedEnvelope, match="would have been enough"):
        open_envelope(stretched, expected_type=ANNOUNCE)


def test_unsorted_keys_refused(alice: Identity) -> None:
    fields = _fields(seal(alice, ANNOUNCE, {"n": 1}))
    # Hand-build the 4-entry map in alphabetical (not DAG-CBOR) key order.
    parts = [b"\xa4"]
    for key in sorted(fields):
        parts.append(dag_cbor.encode(key))
        parts.append(dag_cbor.encode(fields[key]))
    with pytest.raises(MalformedEnvelope):
        open_envelope(b"".join(parts), expected_type=ANNOUNCE)


def test_depth_bounded_before_decoding() -> None:
    deep = b"\x81" * (MAX_CBOR_DEPTH + 1) + b"\x00"
    with pytest.raises(MalformedEnvelope, match="deeper than MAX_CBOR_DEPTH"):
        open_envelope(deep, expected_type=ANNOUNCE)
    very_deep = b"\x81" * 100_000 + b"\x00"  # would exhaust the stack of a recursive decoder
    with pytest.raises(MalformedEnvelope, match="deeper than MAX_CBOR_DEPTH"):
        open_envelope(very_deep, expected_type=ANNOUNCE)


def test_size_bounded(alice: Identity) -> None:
    with pytest.raises(MalformedEnvelope, match=f"exceed the limit of {MAX_ENVELOPE_SIZE}"):
        open_envelope(b"\x00" * (MAX_ENVELOPE_SIZE + 1), expected_type=ANNOUNCE)
    with pytest.raises(EncodeError, match="exceeds MAX_ENVELOPE_SIZE"):
        seal(alice, ANNOUNCE, {"blob": b"\x00" * MAX_ENVELOPE_SIZE})


def test_bad_field_types(alice: Identity) -> None:
    fields = _fields(seal(alice, ANNOUNCE, {"n": 1}))
    for key, value, why in [
        ("sig", b"\x00" * 63, "signature is 63 bytes"),
        ("sig", "text", "must be byte strings"),
        ("signer", b"\x00\x01", "signer: peer id"),
        ("payload", [1], "payload must be a map"),
        ("type", 7, "type must be a short string"),
    ]:
        broken = dict(fields)
        broken[key] = value
        with pytest.raises(MalformedEnvelope, match=why):
            open_envelope(dag_cbor.encode(broken), expected_type=ANNOUNCE)


@pytest.mark.parametrize(
    "payload",
    [{"x": math.nan}, {"x": math.inf}, {"x": {1, 2}}, {"x": object()}, {1: "int key"}, []],
)
def test_unencodable_payload_is_encode_error(alice: Identity, payload: object) -> None:
    with pytest.raises(EncodeError):
        seal(alice, ANNOUNCE, payload)  # type: ignore[arg-type]


def test_header_walk_agrees_with_dag_cbor_on_random_values(alice: Identity) -> None:
    # Random DAG-CBOR values (CIDs, floats, nesting) must seal and open unchanged, and every
    # truncation of an envelope must be refused as malformed.
    rng = random.Random(7)
    with dag_cbor_random.options(seed=7, max_len=4, max_bytes=16, max_chars=16):
        values = list(dag_cbor_random.rand_data(60, max_nesting=4))
    for value in values:
        data = seal(alice, ANNOUNCE, {"v": value})
        assert open_envelope(data, expected_type=ANNOUNCE).payload == {"v": value}
        cut = rng.randrange(len(data))
        with pytest.raises(MalformedEnvelope):
            open_envelope(data[:cut], expected_type=ANNOUNCE)
