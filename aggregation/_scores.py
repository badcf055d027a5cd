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
  number of SCORE_UNITs (1e-4); ``loss_score`` is total (every float pair gives an integer).
  ``score`` = own + min(held, 0) is kept as a figure; no decision uses it since revision 4.
* **Standing** (revision 4, issue 24): each component measured in honest spreads from the
  round's median (``median_spread``, ``round_standing``), clamped to +-STANDING_CLAMP hundredths;
  the round standing (reputation, bans) is the own standing clamped; the held one is for
  admission only (attackers at 0 there can set its median and shrink its spread).
* **Reputation**: an integer EMA of round standings, r <- r + floor((d - r) / REPUTATION_DIVISOR),
  starting at 0; only scored rounds move it.
* **Admission**: an update enters the aggregate iff both standings are >= -ADMIT_SPREADS spreads
  (held-out harm is judged on its own: own-data gain cannot pay for it) and its reputation after
  this round >= ADMIT_REPUTATION. Admitted updates get equal weight; CenteredClip
  (``scored_config``) then runs on them with distance rejection off.
* **Ban evidence**: a peer whose reputation stays below BAN_REPUTATION for
  REPUTATION_BAN_ROUNDS rounds in a row is recommended, with the update CIDs, seeds, bounds and
  losses of those rounds.
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
    "Standing",
    "UpdateScore",
    "admit",
    "ban_bound",
    "draw_indices",
    "left_out_reason",
    "loss_in_range",
    "loss_score",
    "median_spread",
    "own_floor",
    "record_loss",
    "round_standing",
    "score_assignment",
    "score_seed",
    "score_update",
    "scored_config",
    "update_reputation",
]

_SEED_DOMAIN = b"cnode/score/v1\n"
_UNITS = round(1 / limits.SCORE_UNIT)


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

    Total: every pair of floats gives an integer (specs/aggregation.md "Scores and reputation",
    step 4). A ``before`` that is NaN, infinite or above MAX_SCORE_LOSS scores 0 (the state has
    no usable loss on this batch: nothing to judge the update by); an ``after`` that is NaN or
    above MAX_SCORE_LOSS scores -1 (the update blew the model up); otherwise both count as at
    least SCORE_LOSS_FLOOR (zero, negative and denormal losses included), so the quotient is
    finite and below 1e9 in size before it is clamped.
    """
    units = _UNITS
    if not (math.isfinite(before) and before <= limits.MAX_SCORE_LOSS):
        return 0
    if math.isnan(after) or after > limits.MAX_SCORE_LOSS:
        return -units
    floor = limits.SCORE_LOSS_FLOOR
    b, a = max(before, floor), max(after, floor)  # -inf after: the floor
    rel = (b - a) / b
    return max(-units, min(units, round(rel * units)))


def loss_in_range(x: float) -> bool:
    """True when ``x`` is a loss a score record may state, before or after the update: a finite
    value in [0, MAX_SCORE_LOSS], or NaN / +inf (a model with no finite loss on the batch, which
    an honest scorer may measure and the rule scores)."""
    return math.isnan(x) or x == math.inf or 0.0 <= x <= limits.MAX_SCORE_LOSS


def record_loss(x: float) -> float:
    """A measured loss as a scorer states it: NaN stays NaN, anything above MAX_SCORE_LOSS
    becomes +inf (it scores the same), a negative value (rounding of a cross-entropy, -0.0)
    becomes 0.0. The result always passes :func:`loss_in_range`, and ``loss_score`` gives the
    same integer for it as for ``x``."""
    if math.isnan(x):
        return math.nan
    if x > limits.MAX_SCORE_LOSS:
        return math.inf
    return max(0.0, float(x))


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


def update_reputation(previous: Mapping[str, int], standing: Mapping[str, int]) -> dict[str, int]:
    """Reputations after one round: r + floor((d - r) / REPUTATION_DIVISOR) for scored peers,
    ``d`` the round standing (:func:`round_standing`; r = 0 for a peer seen for the first time:
    it starts neutral), unchanged for the others."""
    out = dict(previous)
    for peer in sorted(standing):
        d = int(standing[peer])
        r = previous.get(peer, 0)
        out[peer] = r + (d - r) // limits.REPUTATION_DIVISOR
    return dict(sorted(out.items()))


def median_spread(values: Sequence[int]) -> tuple[int, int]:
    """(lower median, spread) of one round's scores of one component, in integers.

    median = the lower median of all n values. spread = max(SPREAD_FLOOR, the (m - fmax)-th
    smallest |v - median| over the m *distinct* values), fmax = (m - 1) // 2 (revision 6, issue
    36): attackers who send one update between them get one score on the shared held-out batch,
    and counted once they cannot crowd the median to shrink the spread under honest peers (ALIE
    and IPM did: 14-23 % of honest updates left out). With at most fmax distinct values from
    attackers the median lies between the least and the greatest honest value and the spread
    between the (m - 2 fmax)-th smallest and the largest honest deviation, whatever the attackers
    send (specs/aggregation.md "Scores and reputation")."""
    if not values:
        return 0, limits.SPREAD_FLOOR
    ranked = sorted(int(v) for v in values)
    median = ranked[(len(ranked) - 1) // 2]
    distinct = sorted(set(ranked))
    m = len(distinct)
    deviations = sorted(abs(v - median) for v in distinct)
    return median, max(limits.SPREAD_FLOOR, deviations[m - (m - 1) // 2 - 1])


def own_floor(median: int) -> int:
    """The lowest own-data score an update may have (revision 5): min(median, 0) minus
    OWN_FLOOR_PERCENT % of |median|, ``median`` the round's lower median own score. Below it the
    update made the data it was trained on worse by more than a tenth of what the median
    member's update gained there (or, when the median loses, by a tenth more than it lost). Never
    above 0: an update that lowers its own data's loss is never below it, whatever the others
    send."""
    return min(median, 0) - (limits.OWN_FLOOR_PERCENT * abs(median)) // 100


def _standing(value: int, median: int, spread: int) -> int:
    return (100 * (value - median)) // spread


@dataclass(frozen=True)
class Standing:
    """One peer's round, in hundredths of an honest spread from the round's median."""

    own: int  # standing of its own-data score (admission)
    held: int  # standing of its held-out score, judged on its own (admission)
    # The own standing clamped to +-STANDING_CLAMP: what moves the reputation. Not the held one:
    # late in training honest held-out scores are noise around 0, and attackers sitting at 0
    # there (IPM) set its median and shrink its spread (200-round bench: 13 honest bans).
    round: int
    # The own score is below own_floor(the round's median): the update made its sender's own
    # data worse. Such an update is not admitted, and only such rounds count towards a ban.
    harm: bool = False


def round_standing(scores: Mapping[str, UpdateScore]) -> dict[str, Standing]:
    """Every scored peer's standing this round (:class:`Standing`, sorted by peer)."""
    own = median_spread([s.own for s in scores.values()])
    held = median_spread([s.held for s in scores.values()])
    floor = own_floor(own[0])
    out = {}
    for peer in sorted(scores):
        a, b = _standing(scores[peer].own, *own), _standing(scores[peer].held, *held)
        c = limits.STANDING_CLAMP
        out[peer] = Standing(a, b, max(-c, min(c, a)), scores[peer].own < floor)
    return out


def scored_config() -> AggregatorConfig:
    """The rule run on the admitted updates: CenteredClip, tau_scale = SCORED_TAU_SCALE, no
    distance rejection (reject_score 0)."""
    return AggregatorConfig(
        "centered_clip", {"tau_scale": limits.SCORED_TAU_SCALE, "reject_score": 0.0}
    )


def left_out_reason(standing: Standing, reputation: int) -> str | None:
    """Why an update with this standing and reputation (after the round) is not admitted, or
    None when it is: each component's standing >= -ADMIT_SPREADS spreads (own-data gain cannot
    pay for held-out harm), the own score not below the own floor, reputation >=
    ADMIT_REPUTATION."""
    bar = -100 * limits.ADMIT_SPREADS
    if standing.harm:
        return "own-data score below the own floor: the update made its sender's own data worse"
    if standing.own < bar:
        return f"own-data score {standing.own / 100:.2f} spreads from the median (bar {bar // 100})"
    if standing.held < bar:
        return (
            f"held-out score {standing.held / 100:.2f} spreads from the median (bar {bar // 100})"
        )
    if reputation < limits.ADMIT_REPUTATION:
        return f"reputation {reputation} below ADMIT_REPUTATION {limits.ADMIT_REPUTATION}"
    return None


def admit(scores: Mapping[str, UpdateScore], reputation: Mapping[str, int]) -> list[str]:
    """The peers whose update enters the aggregate, sorted (see :func:`left_out_reason`;
    ``reputation`` is after this round)."""
    standing = round_standing(scores)
    return sorted(p for p in scores if left_out_reason(standing[p], reputation.get(p, 0)) is None)


def ban_bound(reputation: Mapping[str, int]) -> int:
    """The reputation a peer must stay below to count a round towards a ban: BAN_REPUTATION
    (in hundredths of a spread: the reputation is already measured in honest spreads, so the
    bound needs no statistic of the round; the argument is kept for the evidence's replay)."""
    del reputation
    return limits.BAN_REPUTATION


BLATANT_REASON = "standing at least BLATANT_SPREADS below the median in "


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
    peer); or, sooner, a round standing at least BLATANT_SPREADS honest spreads below the median
    (unclamped, own data) in that many consecutive scored rounds (blatant harm: no
    need to wait for the running average). Rounds strictly increase."""

    def __init__(self, rounds: int = limits.REPUTATION_BAN_ROUNDS) -> None:
        if rounds < 1:
            raise AggregationInputError("ReputationPolicy needs rounds >= 1")
        self.rounds = rounds
        self._low: dict[str, list[_Low]] = {}
        self._blatant: dict[str, list[tuple[int, Standing, UpdateScore, str | None, str]]] = {}
        self.recommended: set[str] = set()  # peers already recommended, by this or another rule
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
        standing = round_standing(scores)
        for peer in sorted(scores):
            if peer in self.recommended:
                continue
            blatant = self._observe_blatant(round_, seed, peer, standing[peer], scores, cids)
            if blatant is not None:
                out.append(blatant)
                continue
            rep = reputation[peer]
            if rep >= bound or not standing[peer].harm:
                self._low.pop(peer, None)
                continue
            low = self._low.setdefault(peer, [])
            low.append(_Low(round_, rep, bound, scores[peer], cids.get(peer), seed.hex()))
            if len(low) < self.rounds:
                continue
            self.recommended.add(peer)
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

    def _observe_blatant(
        self,
        round_: int,
        seed: bytes,
        peer: str,
        standing: Standing,
        scores: Mapping[str, UpdateScore],
        cids: Mapping[str, str],
    ) -> BanRecommendation | None:
        if standing.own > -100 * limits.BLATANT_SPREADS or not standing.harm:
            self._blatant.pop(peer, None)
            return None
        low = self._blatant.setdefault(peer, [])
        low.append((round_, standing, scores[peer], cids.get(peer), seed.hex()))
        if len(low) < self.rounds:
            return None
        self.recommended.add(peer)
        self._low.pop(peer, None)
        del self._blatant[peer]
        return BanRecommendation(
            peer,
            round_,
            EvidenceKind.BLATANT,
            f"{BLATANT_REASON}{len(low)} rounds in a row",
            cids.get(peer),
            {
                "rounds": [x[0] for x in low],
                "standings": [[x[1].own, x[1].held] for x in low],
                "update_cids": [x[3] for x in low],
                "seeds": [x[4] for x in low],
                "scores": [x[2].to_dict() for x in low],
            },
        )
