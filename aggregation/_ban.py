"""BanPolicy: turn per-round PeerRecords into ban recommendations with evidence.

Rules (specs/aggregation.md "Ban evidence"):

* a rejected update (NaN/Inf, wrong names, shape or dtype) -> recommended at once;
* an outlier (score > OUTLIER_SCORE) in at least k of the last m rounds the peer took part in ->
  recommended, with the figures of those rounds. Only with ``distance`` on: a run that scores
  updates judges harm by the scores, never by distance alone (issue 36, RoundEvidence).

A peer is recommended once; the caller (the node, then the coordinator) decides the ban.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from . import limits
from ._exceptions import AggregationInputError
from ._types import PeerRecord

__all__ = ["BanPolicy", "BanRecommendation", "EvidenceKind"]


class EvidenceKind(StrEnum):
    """What a ban recommendation says the accused did: the coordinator decides on this kind
    (sent as ``kind`` in ``ban_evidence``, specs/coordinator.md#bans), never on the words of
    the reason."""

    REJECTED = "rejected"  # its update failed validation (NaN/Inf, names, shapes, dtypes)
    OUTLIER = "outlier"  # an outlier in k of the last m rounds it took part in
    REPUTATION = "reputation"  # reputation below the ban bound in consecutive scored rounds
    WRONG_SCORE = "wrong_score"  # it signed a score that the recomputation contradicts
    BAD_SCORE_RECORD = "bad_score_record"  # it signed a score record that does not decode
    # Its round standing was at least BLATANT_SPREADS honest spreads below the median in
    # consecutive scored rounds (left to the majority: the coordinator does not replay it).
    BLATANT = "blatant"
    # Its scored update was left out of the aggregate in LEFT_OUT_BAN_ROUNDS scored rounds in a
    # row (issue 36: it only costs the swarm; left to the majority, like blatant).
    LEFT_OUT = "left_out"


@dataclass(frozen=True)
class BanRecommendation:
    """Evidence that a peer should be banned."""

    peer: str  # the peer id
    round: int  # the round that triggered the recommendation
    kind: EvidenceKind  # what the evidence shows: what the coordinator decides on
    reason: str  # the same in words, for people: "rejected: <why>", "outlier in k of ..."
    update_cid: str | None  # CID of the offending update of that round (None if unknown)
    figures: dict[str, Any] = field(default_factory=dict)  # the numbers behind the reason

    def to_payload(self) -> dict[str, Any]:
        """CBOR/JSON-friendly dict: the args of a coordinator ``ban_evidence`` request."""
        return {
            "peer": self.peer,
            "round": self.round,
            "kind": str(self.kind),
            "reason": self.reason,
            "update_cid": self.update_cid,
            "figures": self.figures,
        }


@dataclass
class _Seen:
    round: int
    outlier: bool
    distance: float | None
    score: float | None
    clip_weight: float | None
    update_cid: str | None


class BanPolicy:
    """Stateful across rounds: call observe() once per round, rounds strictly increasing."""

    def __init__(self, k: int = limits.BAN_K, m: int = limits.BAN_M, *, distance: bool = True
                 ) -> None:  # fmt: skip
        if not 1 <= k <= m:
            raise AggregationInputError("BanPolicy needs 1 <= k <= m")
        self.k, self.m = k, m
        self.distance = distance  # outliers by distance are evidence (runs without scores)
        self._history: dict[str, deque[_Seen]] = {}
        self.recommended: set[str] = set()  # peers already recommended, by this or another rule
        self._last_round: int | None = None

    def observe(
        self,
        round: int,
        records: Mapping[str, PeerRecord],
        update_cids: Mapping[str, str] | None = None,
    ) -> list[BanRecommendation]:
        """Record one round; return the new recommendations (sorted by peer id)."""
        if self._last_round is not None and round <= self._last_round:
            raise AggregationInputError(f"round {round} observed after round {self._last_round}")
        self._last_round = round
        cids = update_cids or {}
        out: list[BanRecommendation] = []
        for peer in sorted(records):
            rec = records[peer]
            cid = cids.get(peer)
            if peer in self.recommended:
                continue
            if rec.rejected is not None:
                self.recommended.add(peer)
                out.append(
                    BanRecommendation(
                        peer,
                        round,
                        EvidenceKind.REJECTED,
                        f"rejected: {rec.rejected}",
                        cid,
                        {"rejected": rec.rejected},
                    )
                )
                continue
            if not self.distance:
                continue
            seen = self._history.setdefault(peer, deque(maxlen=self.m))
            seen.append(_Seen(round, rec.outlier, rec.distance, rec.score, rec.clip_weight, cid))
            bad = [s for s in seen if s.outlier]
            if len(bad) >= self.k:
                self.recommended.add(peer)
                out.append(
                    BanRecommendation(
                        peer,
                        round,
                        EvidenceKind.OUTLIER,
                        f"outlier in {len(bad)} of the last {len(seen)} rounds",
                        cid,
                        {
                            "outlier_score": limits.OUTLIER_SCORE,
                            "rounds": [s.round for s in bad],
                            "distances": [s.distance for s in bad],
                            "scores": [s.score for s in bad],
                            "clip_weights": [s.clip_weight for s in bad],
                            "update_cids": [s.update_cid for s in bad],
                        },
                    )
                )
        return out
