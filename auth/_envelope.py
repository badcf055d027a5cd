"""Signed envelopes: seal and open-and-verify. See specs/identity.md#envelope.

An envelope is one canonical DAG-CBOR map ``{payload, sig, signer, type}``. The signature covers
``DOMAIN + DAG-CBOR({payload, signer, type})``: the domain string keeps these signatures apart from
everything else the same key signs (the libp2p noise handshake, libp2p records), and the payload
type inside keeps one kind of message from being accepted as another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cnode._cbor import CBORError, encode
from cnode._cbor import decode as _decode

from . import limits
from ._exceptions import (
    BadSignature,
    EncodeError,
    MalformedEnvelope,
    PeerIdError,
    UnknownPayloadType,
    WrongSigner,
)
from ._identity import Identity, peer_id_from_bytes, public_key_from_peer_id_bytes


def decode(data: bytes) -> Any:
    """One envelope's DAG-CBOR under auth's bounds (size, depth, item count); CBORError if bad."""
    return _decode(
        data,
        max_size=limits.MAX_ENVELOPE_SIZE,
        max_depth=limits.MAX_CBOR_DEPTH,
        max_items=limits.MAX_CBOR_ITEMS,
    )


# Prepended to the DAG-CBOR bytes that are signed; never sent.
DOMAIN = b"cnode/envelope/v1\x00"

HF_BINDING_TYPE = "cnode/hf-binding/v1"
ACCESS_TOKEN_TYPE = "cnode/access-token/v1"

# Every payload type a node accepts; one line each in specs/identity.md#payload-types.
PAYLOAD_TYPES: frozenset[str] = frozenset(
    {
        HF_BINDING_TYPE,  # {peer, username, at}: a peer claims an HF username (self-signed)
        ACCESS_TOKEN_TYPE,  # {peer, username, run, expires_at}: the coordinator admits a peer
        "cnode/announce/v1",  # gossipsub: which CIDs a peer holds
        "cnode/update-header/v1",  # gossipsub: a peer's update for (run, round), by manifest CID
        "cnode/partition-result/v1",  # an aggregator's result for one partition
        "cnode/score-record/v1",  # a member's losses of the updates it scores (issue 12)
        "cnode/run-state/v1",  # coordinator: the signed run state
        "cnode/request/v1",  # a peer's (or admin's) signed request to the coordinator
    }
)

_ENVELOPE_KEYS = frozenset({"payload", "sig", "signer", "type"})
_SIGNATURE_LEN = 64


@dataclass(frozen=True)
class Opened:
    """A verified envelope."""

    payload_type: str  # one of PAYLOAD_TYPES, equal to the caller's expected_type
    payload: dict[str, Any]  # the signed payload (DAG-CBOR data model: str keys)
    signer: str  # base58btc peer id whose key made the signature


def _signed_bytes(payload_type: str, signer: bytes, payload: dict[str, Any]) -> bytes:
    return DOMAIN + encode({"payload": payload, "signer": signer, "type": payload_type})


def seal(identity: Identity, payload_type: str, payload: dict[str, Any]) -> bytes:
    """Sign ``payload`` as ``payload_type`` by ``identity``; return the envelope bytes.

    Raises:
        UnknownPayloadType: ``payload_type`` is not in PAYLOAD_TYPES.
        EncodeError: ``payload`` is not a dict with str keys, holds values DAG-CBOR cannot carry
            (floats NaN/Infinity, tuples, sets, objects), or the envelope exceeds the limits.
    """
    if payload_type not in PAYLOAD_TYPES:
        raise UnknownPayloadType(f"cannot seal unknown payload type {payload_type!r}")
    if not isinstance(payload, dict) or not all(isinstance(k, str) for k in payload):
        raise EncodeError(f"{payload_type} payload must be a dict with str keys")
    signer = identity.peer_id.to_bytes()
    try:
        signature = identity.sign(_signed_bytes(payload_type, signer, payload))
        data = encode(
            {"payload": payload, "sig": signature, "signer": signer, "type": payload_type}
        )
    except CBORError as exc:
        raise EncodeError(f"{payload_type} payload: {exc}") from exc
    if len(data) > limits.MAX_ENVELOPE_SIZE:
        raise EncodeError(
            f"{payload_type} envelope of {len(data)} bytes exceeds MAX_ENVELOPE_SIZE "
            f"{limits.MAX_ENVELOPE_SIZE}"
        )
    try:
        decode(data)  # what we send, we must also accept
    except CBORError as exc:
        raise EncodeError(f"{payload_type} payload: {exc}") from exc
    return data


def open_envelope(data: bytes, *, expected_type: str, expected_signer: str | None = None) -> Opened:
    """Decode, bound and verify one envelope of type ``expected_type``.

    Checks, in order: size and structure (MalformedEnvelope), payload type known and equal to
    ``expected_type`` (UnknownPayloadType), signer's peer id well formed (MalformedEnvelope),
    signer equal to ``expected_signer`` if given (WrongSigner), signature (BadSignature).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedEnvelope(f"envelope must be bytes, got {type(data).__name__}")
    try:
        value = decode(bytes(data))
    except CBORError as exc:
        raise MalformedEnvelope(f"malformed envelope: {exc}") from exc
    if not isinstance(value, dict) or set(value) != _ENVELOPE_KEYS:
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise MalformedEnvelope(
            f"malformed envelope: expected keys payload/sig/signer/type, got {keys}"
        )
    payload_type, payload = value["type"], value["payload"]
    signer_raw, signature = value["signer"], value["sig"]
    if not isinstance(payload_type, str) or len(payload_type) > limits.MAX_PAYLOAD_TYPE_LEN:
        raise MalformedEnvelope("malformed envelope: type must be a short string")
    if not isinstance(payload, dict):
        raise MalformedEnvelope("malformed envelope: payload must be a map")
    if not isinstance(signer_raw, bytes) or not isinstance(signature, bytes):
        raise MalformedEnvelope("malformed envelope: signer and sig must be byte strings")
    if len(signature) != _SIGNATURE_LEN:
        raise MalformedEnvelope(
            f"malformed envelope: signature is {len(signature)} bytes, expected {_SIGNATURE_LEN}"
        )
    if payload_type not in PAYLOAD_TYPES:
        raise UnknownPayloadType(f"unknown payload type {payload_type!r}")
    if payload_type != expected_type:
        raise UnknownPayloadType(
            f"payload type {payload_type!r} where {expected_type!r} was expected"
        )
    try:
        public_key = public_key_from_peer_id_bytes(signer_raw)
    except PeerIdError as exc:
        raise MalformedEnvelope(f"malformed envelope: signer: {exc}") from exc
    signer = peer_id_from_bytes(signer_raw)
    if expected_signer is not None and signer != expected_signer:
        raise WrongSigner(f"{payload_type} signed by {signer}, expected {expected_signer}")
    if not public_key.verify(_signed_bytes(payload_type, signer_raw, payload), signature):
        raise BadSignature(f"{payload_type} from {signer}: signature does not verify")
    return Opened(payload_type=payload_type, payload=payload, signer=signer)
