"""The signed records nodes exchange, sealed, addressed and opened by one piece of code.

An update header, a score record and a partition result are each a DAG-CBOR envelope signed by
the peer the record names (specs/training.md): sealing checks the signer is that peer, the CID
is the envelope's, and opening checks the size bound, the signature and type, the run and the
round before the record's own ``from_payload`` sees a field. ``RecordKind`` holds what differs:
the envelope type, the bound and the words of the errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from cnode.auth import EnvelopeError, Identity, open_envelope, seal
from cnode.storage import CID, DAG_CBOR, compute_cid

from . import limits
from ._exceptions import PeerUpdateError

__all__ = ["RecordKind", "SignedRecord", "bounded_map", "peer_field", "reason_field", "record_cid"]

# How a record's ``from_payload`` says a field is bad: ``bad(message)`` -> the error to raise.
Bad = Callable[[str], Exception]


class SignedRecord(Protocol):
    """What every signed record holds: who signed it, for which run and round."""

    @property
    def peer(self) -> str: ...
    @property
    def run(self) -> str: ...
    @property
    def round(self) -> int: ...
    def to_payload(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=SignedRecord)


def record_cid(envelope: bytes) -> CID:
    """The CID a signed record is stored and referenced under (a DAG-CBOR block)."""
    return compute_cid(envelope, DAG_CBOR)


def bounded_map(
    p: Mapping[str, Any], key: str, bad: Bad, bound: int, name: str
) -> Mapping[str, Any]:
    """Field ``key`` of a payload: a map of at most ``bound`` entries (``name`` in limits.py)."""
    value = p[key]
    if not isinstance(value, Mapping) or len(value) > bound:
        raise bad(f"{key} must be a map of at most {name} entries")
    return value


def peer_field(value: object, bad: Bad, what: str = "a peer id") -> str:
    """A peer id inside a record: a non-empty string of at most MAX_PEER_ID_CHARS."""
    if not isinstance(value, str) or not 0 < len(value) <= limits.MAX_PEER_ID_CHARS:
        raise bad(f"{what} is not a short string")
    return value


def reason_field(value: object, bad: Bad, what: str = "a reason") -> str:
    """A reason inside a record: a string of at most MAX_REASON_CHARS."""
    if not isinstance(value, str) or len(value) > limits.MAX_REASON_CHARS:
        raise bad(f"{what} is not a string within MAX_REASON_CHARS")
    return value


@dataclass(frozen=True)
class RecordKind(Generic[R]):
    """One kind of signed record: its envelope type, size bound, decoder and words."""

    envelope_type: str  # the envelope's payload type, e.g. "cnode/score-record/v1"
    noun: str  # what error messages call it: "header", "score record", "partition result"
    signer: str  # who signs it, in words: "peer", "scorer", "aggregator"
    max_bytes: int  # the envelope's size bound
    bound: str  # the bound's name in limits.py, for the message
    decode: Callable[[Mapping[str, Any], str], R]  # from_payload(payload, signer)
    # What is raised once the signature verifies (a bad field, another run or round): a
    # subclass of PeerUpdateError when the signed bytes are evidence against the signer.
    signed_error: type[PeerUpdateError] = PeerUpdateError

    def seal(self, identity: Identity, record: R) -> bytes:
        """The record as a signed envelope; ValueError unless ``identity`` is the peer it names."""
        if record.peer != identity.peer_id_str:
            raise ValueError(f"a {self.noun} is signed by the {self.signer} it names")
        return seal(identity, self.envelope_type, record.to_payload())

    def open(
        self, envelope: bytes, *, run: str, round_: int | None = None, signer: str | None = None
    ) -> R:
        """Verify a signed record's size, signature, type, run and round (and ``signer`` when
        given); raise PeerUpdateError naming what is wrong."""
        who = signer or "unknown peer"
        if len(envelope) > self.max_bytes:
            raise PeerUpdateError(
                who, f"{self.noun} of {len(envelope)} bytes is too large (> {self.bound})"
            )
        try:
            opened = open_envelope(
                envelope, expected_type=self.envelope_type, expected_signer=signer
            )
        except EnvelopeError as exc:
            raise PeerUpdateError(who, f"bad {self.noun} envelope: {exc}") from exc
        # From here on the signer is proven: what is wrong is its own doing.
        try:
            record = self.decode(opened.payload, opened.signer)
        except PeerUpdateError as exc:
            if self.signed_error is PeerUpdateError:
                raise
            raise self.signed_error(opened.signer, exc.reason) from exc
        if record.run != run:
            raise self.signed_error(
                opened.signer, f"{self.noun} is for run {record.run[:80]!r}, not {run[:80]!r}"
            )
        if round_ is not None and record.round != round_:
            raise self.signed_error(
                opened.signer, f"{self.noun} is for round {record.round}, not {round_}"
            )
        return record
