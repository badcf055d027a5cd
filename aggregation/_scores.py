"""Scores of updates on data anyone can check, and a reputation across rounds (issue 12).

Pure functions: the caller computes losses (forward passes of the model it holds); this module
turns them into integer scores, keeps the reputation, decides admission and ban evidence. All
decisions are made on integers, so every node that computed the same losses up to rounding (far
below ``SCORE_UNIT``) makes the same decisions. See specs/aggregation.md "Scores and reputation".

* The **score seed** of a round is sha256 over the round's sorted update header CIDs: fixed only
  once every header is out, so no peer can fit in advance the batches it will be scored on.
* For each accepted update u of sender p, on the agreed state theta:
  ``own`` = relative loss decrease on a batch of p's own assigned data,
  ``held`` = relative loss decrease on a batch of the shared held-out split,
  each ``(L(theta) - L(theta + SCORE_STEP u)) / L(theta)`` clamped to [-1, 1], rounded to an integer
  number of SCORE_UNITs (1e-4). The round score is ``own + min(held, 0)``: an update must improve
  its sender's own data, and pays for what it breaks on the shared split, but an honest peer with
  different data is not asked to improve data it does not hold.
* **Reputation**: an integer EMA, r <- r + floor((s - r) / REPUTATION_DIVISOR), starting at 0;
  only scored rounds move it.
* **Admission**: an update enters the aggregate iff its round score >= ``admission_bar`` (the
  round's lower median score // ADMIT_MEDIAN_DIVISOR when > 0, else ADMIT_SCORE) and its
  reputation after this round >= ADMIT_REPUTATION. Admitted updates get equal weight;
  CenteredClip (``scored_config``) then runs on them with distance rejection off.
* **Ban evidence**: a peer whose reputation stays below ``ban_bound`` (min(BAN_REPUTATION, median
  - BAN_MADS x MAD of the round's reputations)) for REPUTATION_BAN_ROUNDS rounds in a row is
  recommended, with the update CIDs, seeds, bounds and losses of those rounds.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import limits
from ._ban import BanRecommendation, EvidenceKind
from ._exceptions import AggregationInputError
from ._types import AggregatorConfig

__all__ = [
    "ReputationPolicy",
    "UpdateScore",
    "admission_bar",
    "admit",
    "ban_bound",
    "draw_indices",
    "loss_score",
    "score_assignment",
    "score_seed",
    "score_update",
    "scored_config",
    "update_reputation",
]

_SEED_DOMAIN = b"cnode/score/v1\n"


def score_seed(header_cids: Iterable[str]) -> bytes:
    """sha256("cnode/score/v1\\n" + the sorted header CIDs joined by "\\n"): the round's seed."""
    cids = sorted(header_cids)
    if not cids or any(not isinstance(c, str) or not c or "\n" in c for c in cids):
        raise AggregationInputError("score_seed needs non-empty CID strings without newlines")
    return hashlib.sha256(_SEED_DOMAIN + "\n".join(cids).encode()).digest()


def draw_indices(seed: bytes, purpose: str, population: int, count: int) -> list[int]:
    """``count`` indices in [0, population), with replacement, from sha256(seed, purpose, i).

    ``purpose`` names the batch ("own:<peer id>" or "held"). Each index is the first 8 bytes of
    sha256(seed || purpose || i as 4 bytes) modulo ``population`` (bias < 2^-40 for populations
    below 2^24: immaterial for scoring, and the same on every node).
    """
    if not isinstance(seed, bytes) or len(seed) != 32:
        raise AggregationInputError("draw_indices needs a 32-byte seed")
    if population < 1 or not 1 <= count <= limits.MAX_SCORE_BATCH:
        raise AggregationInputError(
            f"draw_indices needs population >= 1 and 1 <= count <= MAX_SCORE_BATCH "
            f"({limits.MAX_SCORE_BATCH}), got {population} and {count}"
        )
    head = seed + purpose.encode() + b"\n"
    return [
        int.from_bytes(hashlib.sha256(head + i.to_bytes(4, "big")).digest()[:8], "big") % population
        for i in range(count)
    ]


def loss_score(before: float, after: float) -> int:
    """Relative loss decrease (before - after) / before, clamped to [-1, 1], in SCORE_UNITs.

    A non-finite ``after`` (the update blew the model up) scores -1. ``before`` must be finite
    and > 0 (a cross-entropy of a model that has not memorised its batch).
    """
    if not (math.isfinite(before) and before > 0):
        raise AggregationInputError(f"loss before the update must be finite and > 0: {before}")
    units = round(1 / limits.SCORE_UNIT)
    if not math.isfinite(after):
        return -units
    rel = (before - after) / before
    return max(-units, min(units, round(rel * units)))


@dataclass(frozen=True)
class UpdateScore:
    """One update's losses and the integer scores derived from them."""

    peer: str
    own_before: float  # loss of the agreed state on the sender's own batch
    own_after: float  # loss of state + update on that batch
    held_before: float  # loss of the agreed state on the shared held-out batch
    held_after: float  # loss of state + update on that batch
    own: int  # loss_score(own_before, own_after)
    held: int  # loss_score(held_before, held_after)
    score: int  # own + min(held, 0): the round score

    def to_dict(self) -> dict[str, Any]:
        """JSON/CBOR-friendly: a non-finite loss is given as its repr ("inf", "nan")."""

        def num(x: float) -> float | str:
            return x if math.isfinite(x) else repr(x)

        return {
            "peer": self.peer,
            "own_before": num(self.own_before),
            "own_after": num(self.own_after),
            "held_before": num(self.held_before),
            "held_after": num(self.held_after),
            "own": self.own,
            "held": self.held,
            "score": self.score,
        }


def score_update(
    peer: str, own_before: float, own_after: float, held_before: float, held_after: float
) -> UpdateScore:
    """The scores of one update from its four losses (see the module docstring)."""
    own = loss_score(own_before, own_after)
    held = loss_score(held_before, held_after)
    return UpdateScore(
        peer, own_before, own_after, held_before, held_after, own, held, own + min(held, 0)
    )


def score_assignment(order: Sequence[str], per_update: int) -> dict[str, list[str]]:
    """Who scores whom when scoring is spread (partitioned rounds): scorer -> its targets, the
    next ``min(per_update, n - 1)`` members after it in ``order`` (wrapping). Every member then
    has that many scorers, never itself, and the order (the round's partition assignment order,
    fixed by the coordinator's signed member list) is one no member picks."""
    if len(set(order)) != len(order):
        raise AggregationInputError("score_assignment: members must be distinct")
    if per_update < 1:
        raise AggregationInputError("score_assignment needs per_update >= 1")
    n = len(order)
    k = min(per_update, n - 1)
    return {order[i]: [order[(i + j) % n] for j in range(1, k + 1)] for i in range(n)}


def update_reputation(previous: Mapping[str, int], scores: Mapping[str, int]) -> dict[str, int]:
    """Reputations after one round: r + floor((s - r) / REPUTATION_DIVISOR) for scored peers
    (r = 0 for a peer seen for the first time: it starts neutral), unchanged for the others."""
    out = dict(previous)
    for peer in sorted(scores):
        s = int(scores[peer])
        r = previous.get(peer, 0)
        out[peer] = r + (s - r) // limits.REPUTATION_DIVISOR
    return dict(sorted(out.items()))


def scored_config() -> AggregatorConfig:
    """The rule run on the admitted updates: CenteredClip, tau_scale = SCORED_TAU_SCALE, no
    distance rejection (reject_score 0)."""
    return AggregatorConfig(
        "centered_clip", {"tau_scale": limits.SCORED_TAU_SCALE, "reject_score": 0.0}
    )


def admission_bar(scores: Mapping[str, int]) -> int:
    """The least round score admitted: lower median // ADMIT_MEDIAN_DIVISOR when that median is
    > 0; ADMIT_SCORE when it is <= 0 (a round where a typical update does not measurably help
    its own data: only blatant harm and the reputation keep an update out)."""
    if not scores:
        return limits.ADMIT_SCORE
    ranked = sorted(scores.values())
    median = ranked[(len(ranked) - 1) // 2]
    return median // limits.ADMIT_MEDIAN_DIVISOR if median > 0 else limits.ADMIT_SCORE


def admit(scores: Mapping[str, int], reputation: Mapping[str, int]) -> list[str]:
    """The peers whose update enters the aggregate, sorted: round score >= admission_bar(scores)
    and reputation (after this round) >= ADMIT_REPUTATION."""
    bar = admission_bar(scores)
    return sorted(
        p for p, s in scores.items() if s >= bar and reputation.get(p, 0) >= limits.ADMIT_REPUTATION
    )


def ban_bound(reputation: Mapping[str, int]) -> int:
    """The reputation a peer must stay below to count a round towards a ban, from the reputations
    of the peers scored this round: min(BAN_REPUTATION, median - BAN_MADS x MAD), median and MAD
    (median absolute deviation) the lower medians, in integers. With f < n/2 both are set by
    honest peers, so the bound sits BAN_MADS honest spreads below a typical honest reputation,
    whatever the scale and the noise of this run's scores."""
    if not reputation:
        return limits.BAN_REPUTATION
    values = sorted(reputation.values())
    mid = (len(values) - 1) // 2
    median = values[mid]
    mad = sorted(abs(v - median) for v in values)[mid]
    return min(limits.BAN_REPUTATION, median - limits.BAN_MADS * mad)


@dataclass
class _Low:
    round: int
    reputation: int
    bound: int
    score: UpdateScore
    update_cid: str | None
    seed: str


class ReputationPolicy:
    """Ban evidence from reputations: below ban_bound(the round's reputations) in
    REPUTATION_BAN_ROUNDS consecutive scored rounds of a peer -> one BanRecommendation (once per
    peer). Rounds strictly increase."""

    def __init__(self, rounds: int = limits.REPUTATION_BAN_ROUNDS) -> None:
        if rounds < 1:
            raise AggregationInputError("ReputationPolicy needs rounds >= 1")
        self.rounds = rounds
        self._low: dict[str, list[_Low]] = {}
        self._recommended: set[str] = set()
        self._last: int | None = None

    def observe(
        self,
        round_: int,
        seed: bytes,
        scores: Mapping[str, UpdateScore],
        reputation: Mapping[str, int],
        update_cids: Mapping[str, str] | None = None,
    ) -> list[BanRecommendation]:
        """One round's scores and reputations (after the round); new recommendations by peer."""
        if self._last is not None and round_ <= self._last:
            raise AggregationInputError(f"round {round_} observed after round {self._last}")
        self._last = round_
        cids = update_cids or {}
        bound = ban_bound({p: reputation[p] for p in scores})
        out: list[BanRecommendation] = []
        for peer in sorted(scores):
            if peer in self._recommended:
                continue
            rep = reputation[peer]
            if rep >= bound:
                self._low.pop(peer, None)
                continue
            low = self._low.setdefault(peer, [])
            low.append(_Low(round_, rep, bound, scores[peer], cids.get(peer), seed.hex()))
            if len(low) < self.rounds:
                continue
            self._recommended.add(peer)
            del self._low[peer]
            out.append(
                BanRecommendation(
                    peer,
                    round_,
                    EvidenceKind.REPUTATION,
                    f"reputation below the ban bound in {len(low)} rounds in a row",
                    cids.get(peer),
                    {
                        "rounds": [x.round for x in low],
                        "reputations": [x.reputation for x in low],
                        "bounds": [x.bound for x in low],
                        "update_cids": [x.update_cid for x in low],
                        "seeds": [x.seed for x in low],
                        "scores": [x.score.to_dict() for x in low],
                    },
                )
            )
        return out
