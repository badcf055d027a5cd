"""Signed score records: one member's losses of the updates it was assigned to score (issue 12).

In a partitioned round no node holds every update whole, so scoring is spread over the members
(specs/training.md#scores-in-partitioned-rounds): each member scores the updates of the next
``SCORERS_PER_UPDATE`` members in the round's assignment order and signs what it measured as a
:class:`ScoreRecord` (``cnode/score-record/v1``), stored as a DAG-CBOR block and reported to the
coordinator (op ``score``). The record carries the four float64 losses of each target, not the
integer scores: every reader derives the integers with ``score_update``, so a record cannot
state losses and scores that disagree.

Decoding is bounded and typed: anything else raises :class:`PeerUpdateError` naming the field.
Each loss is a number in [0, MAX_SCORE_LOSS] or "inf" / "nan" (``loss_in_range``), whichever side
of the update it is on; a record whose signature verifies but whose content does not decode (an
out-of-range loss, a wrong run or round) raises :class:`BadScoreRecordError`: the signed bytes
prove their signer sent it, so it is ban evidence (specs/training.md#scores-in-partitioned-rounds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cnode.aggregation import UpdateScore, loss_in_range, record_loss, score_update
from cnode.storage import CID, StorageError

from .. import limits
from .._exceptions import PeerUpdateError
from .._records import RecordKind, bounded_map, peer_field, reason_field, record_cid

__all__ = [
    "SCORE_RECORD_TYPE",
    "BadScoreRecordError",
    "ScoreRecord",
    "TargetLosses",
    "open_score_record",
    "score_record_cid",
    "seal_score_record",
]

SCORE_RECORD_TYPE = "cnode/score-record/v1"
_NON_FINITE = {"inf": math.inf, "nan": math.nan}


class BadScoreRecordError(PeerUpdateError):
    """A score record whose signature verifies but whose content is not a record of this run
    and round within the limits (an out-of-range loss, say): its signer sent what no honest
    node sends, and the signed bytes show it."""


@dataclass(frozen=True)
class TargetLosses:
    """What a scorer measured of one target's update (float64 losses, specs/training.md#scores)."""

    header: CID  # the target's signed update header (the round record lists the same CID)
    # Each loss is in [0, MAX_SCORE_LOSS] or +inf / NaN (loss_in_range):
    own_before: float  # loss of the agreed state on the target's own batch
    own_after: float  # loss of state + SCORE_STEP x update on that batch
    held_before: float  # loss of the agreed state on the held-out batch
    held_after: float  # loss of state + SCORE_STEP x update on that batch

    @classmethod
    def measured(cls, header: CID, losses: tuple[float, float, float, float]) -> TargetLosses:
        """What a scorer signs for four measured losses: each as ``record_loss`` states it (in
        range, and scoring the same as measured)."""
        own_before, own_after, held_before, held_after = (record_loss(x) for x in losses)
        return cls(header, own_before, own_after, held_before, held_after)

    def score(self, peer: str) -> UpdateScore:
        """The integer scores these losses give (the same on every reader)."""
        return score_update(
            peer, self.own_before, self.own_after, self.held_before, self.held_after
        )

    def to_payload(self) -> list[Any]:
        def num(x: float) -> float | str:
            return x if math.isfinite(x) else repr(x)  # DAG-CBOR has no NaN/Infinity

        losses = (self.own_before, self.own_after, self.held_before, self.held_after)
        return [str(self.header), *(num(v) for v in losses)]


@dataclass(frozen=True)
class ScoreRecord:
    """The signed statement "in round R, on state BASE with seed SEED, these updates gave these
    losses"."""

    run: str
    round: int  # >= 1
    peer: str  # the scorer (the signer)
    base: CID  # the round's parent state the losses were computed on
    seed: bytes  # score_seed of the round's header CIDs (32 bytes; hex on the wire)
    scores: dict[str, TargetLosses]  # target member -> its losses
    unscored: dict[str, str]  # target member -> why it has no losses (not fetched, invalid)

    def to_payload(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "round": self.round,
            "peer": self.peer,
            "base": str(self.base),
            "seed": self.seed.hex(),
            "scores": {m: t.to_payload() for m, t in sorted(self.scores.items())},
            "unscored": dict(sorted(self.unscored.items())),
        }

    @classmethod
    def from_payload(cls, p: Mapping[str, Any], signer: str) -> ScoreRecord:
        """Decode; raise :class:`PeerUpdateError` naming what is wrong."""

        def bad(why: str) -> PeerUpdateError:
            return PeerUpdateError(signer, f"score record: {why}")

        keys = {"run", "round", "peer", "base", "seed", "scores", "unscored"}
        if set(p) != keys:
            raise bad(f"fields {sorted(p)} != {sorted(keys)}")
        if not isinstance(p["round"], int) or isinstance(p["round"], bool) or p["round"] < 1:
            raise bad("round must be an integer >= 1")
        if p["peer"] != signer:
            raise bad("names another peer than its signer")
        if not isinstance(p["run"], str) or len(p["run"]) > limits.MAX_PEER_ID_CHARS:
            raise bad("run must be a short string")
        seed = p["seed"]
        if not isinstance(seed, str) or len(seed) != 64:
            raise bad("seed must be 64 hex digits")
        try:
            seed_bytes = bytes.fromhex(seed)
            base = CID.parse(p["base"])
        except (ValueError, StorageError, TypeError) as exc:
            raise bad(f"bad seed or base: {exc}") from exc
        scores = {_peer(m, bad): _losses(m, v, bad) for m, v in _map(p, "scores", bad).items()}
        unscored = {_peer(m, bad): _reason(t, bad) for m, t in _map(p, "unscored", bad).items()}
        if set(scores) & set(unscored):
            raise bad("a target is both scored and unscored")
        if signer in scores or signer in unscored:
            raise bad("a scorer never scores its own update")
        return cls(p["run"], p["round"], signer, base, seed_bytes, scores, unscored)


def _map(p: Mapping[str, Any], key: str, bad: Any) -> Mapping[str, Any]:
    return bounded_map(p, key, bad, limits.MAX_SCORE_TARGETS, "MAX_SCORE_TARGETS")


def _peer(value: object, bad: Any) -> str:
    return peer_field(value, bad, "a target peer id")


def _reason(value: object, bad: Any) -> str:
    return reason_field(value, bad, "an unscored reason")


def _losses(member: str, value: object, bad: Any) -> TargetLosses:
    who = member[-8:] if isinstance(member, str) else "?"
    if not (isinstance(value, list) and len(value) == 5):
        raise bad(f"losses of {who} must be [header CID, 4 losses]")
    try:
        header = CID.parse(value[0])
    except (StorageError, TypeError) as exc:
        raise bad(f"losses of {who}: bad header CID: {exc}") from exc
    nums = []
    for i, x in enumerate(value[1:]):
        if isinstance(x, str) and x in _NON_FINITE:
            nums.append(_NON_FINITE[x])
        elif isinstance(x, float | int) and not isinstance(x, bool) and loss_in_range(float(x)):
            nums.append(float(x))
        else:
            raise bad(
                f"losses of {who}: value {i + 1} is not a loss in [0, MAX_SCORE_LOSS] or "
                f"'inf' / 'nan': {str(x)[:20]!r}"
            )
    return TargetLosses(header, *nums)


SCORE_RECORDS = RecordKind(
    SCORE_RECORD_TYPE,
    "score record",
    "scorer",
    limits.MAX_SCORE_RECORD_BYTES,
    "MAX_SCORE_RECORD_BYTES",
    ScoreRecord.from_payload,
    # Once the signature verifies, what is wrong is the signer's own doing: ban evidence.
    signed_error=BadScoreRecordError,
)
# The record as a signed envelope (``cnode/score-record/v1``); its CID; its checks on opening
# (PeerUpdateError before the signature verifies, BadScoreRecordError after).
seal_score_record = SCORE_RECORDS.seal
score_record_cid = record_cid
open_score_record = SCORE_RECORDS.open
