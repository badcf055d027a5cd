"""The round decision: one pure function of a round's agreed inputs (issue 36).

What a round decides, given what every honest node agrees on (the members, their updates or the
slices of them an aggregator fetched, the agreed scores, the reputation and the ban history):

* **admission** (:func:`admission`): the scored updates that enter the aggregate, the ones left
  out (each with its reason) and the reputation after the round;
* **the partition quorum** (:func:`partition_quorum`): whether one partition's result may be
  published. Updates left out on agreed evidence count as *decided*, not as missing: a swarm
  that rejects its attackers is never frozen by them;
* **the aggregate** of each partition (or of the whole update in a full round), by the run's
  rule on the admitted inputs;
* **the ban evidence** of every kind (:class:`RoundEvidence`), kept across rounds.

The node's full round (``node/train/_trainer.py``), its partitioned round (the aggregator in
``node/train/exchange/_partitioned.py``, the assembly in ``node/train/_trainer_partitioned.py``),
the coordinator's replay of partition evidence and ``bench/robustness.py`` call these functions;
:func:`decide_round` composes them for a whole round held in one place (the bench, the tests).
Nothing else decides. See specs/aggregation.md "The round decision".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from . import limits
from ._aggregate import aggregate
from ._ban import BanPolicy, BanRecommendation, EvidenceKind
from ._exceptions import AggregationInputError, NotEnoughUpdatesError
from ._partition import (
    PARTITION_TENSOR,
    aggregate_partition,
    combine_records,
    flat_segments,
    partition_count,
    partition_segments,
    segment_ranges,
    unflatten_segments,
)
from ._scores import (
    ReputationPolicy,
    Standing,
    UpdateScore,
    left_out_reason,
    round_standing,
    update_reputation,
)
from ._types import AggregatorConfig, PeerRecord, TensorSpec
from ._validate import validate_update

__all__ = [
    "Admission",
    "RoundDecision",
    "RoundEvidence",
    "admission",
    "decide_round",
    "partition_quorum",
]

Update = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Admission:
    """What one round's agreed scores decide."""

    standing: dict[str, Standing]  # every scored peer's standing (sorted by peer)
    reputation: dict[str, int]  # after this round: every peer ever scored
    admitted: tuple[str, ...]  # scored and admitted (sorted)
    left_out: dict[str, str]  # scored and not admitted: why (the same words on every node)


def admission(scores: Mapping[str, UpdateScore], reputation: Mapping[str, int]) -> Admission:
    """Standings, reputations after the round, and who is admitted (``reputation``: before the
    round). The one place where scores become a decision (specs/aggregation.md "Admission")."""
    standing = round_standing(scores)
    after = update_reputation(reputation, {p: d.round for p, d in standing.items()})
    admitted: list[str] = []
    left_out: dict[str, str] = {}
    for peer in sorted(scores):
        why = left_out_reason(standing[peer], after.get(peer, 0))
        if why is None:
            admitted.append(peer)
        else:
            left_out[peer] = f"left out by scores: {why}"
    return Admission(standing, after, tuple(admitted), left_out)


def partition_quorum(inputs: int, decided: int, members: int) -> bool:
    """May a partition result that aggregates ``inputs`` updates be published, when ``decided``
    other members' updates were left out on agreed evidence (scores, an invalid header or
    encoding, no header in the round record, a ban)?

    Yes iff inputs + decided is a strict majority of the round's ``members``: the members whose
    update the aggregator *could not fetch* are a strict minority. A node cut off from most of the
    swarm still cannot make its own few updates stand for a partition, and a swarm that rejects
    its attackers, however many, is never frozen by them (specs/aggregation.md "The partition
    quorum")."""
    if min(inputs, decided, members) < 0:
        raise AggregationInputError("partition_quorum takes counts >= 0")
    return 2 * (inputs + decided) > members


@dataclass
class _Streak:
    rounds: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    update_cids: list[str | None] = field(default_factory=list)


class RoundEvidence:
    """The ban evidence of a run, round after round (one per node, one per bench run).

    * a rejected update (malformed, non-finite): at once (:class:`BanPolicy`);
    * without scores: an outlier by distance in k of the last m rounds (:class:`BanPolicy`);
      with scores, distance is no evidence: honest peers whose data differ from the rest sit far
      from the centre (issue 36 measured 10 of 18 honest peer-runs banned so under ALIE);
    * with scores: reputation and blatant harm (:class:`ReputationPolicy`), and a peer whose
      scored update was left out on its own data (under the own bar or floor) in
      LEFT_OUT_BAN_ROUNDS consecutive scored rounds (it only costs the swarm: kind ``left_out``).

    Rounds strictly increase. Each peer is recommended once.
    """

    def __init__(self, *, scored: bool) -> None:
        self.scored = scored
        self.distance = BanPolicy(distance=not scored)
        self.reputation = ReputationPolicy()
        self._left_out: dict[str, _Streak] = {}
        self.recommended: set[str] = set()

    def observe(
        self,
        round_: int,
        records: Mapping[str, PeerRecord],
        *,
        update_cids: Mapping[str, str] | None = None,
        scores: Mapping[str, UpdateScore] | None = None,
        seed: bytes = b"",
        decided: Admission | None = None,
    ) -> list[BanRecommendation]:
        """One round: the aggregation records (rejected updates, distances), and with scores the
        round's agreed scores, seed and admission. New recommendations, sorted by peer."""
        cids = dict(update_cids or {})
        out = self.distance.observe(round_, records, cids)
        if scores and decided is not None:
            out += self.reputation.observe(round_, seed, scores, decided.reputation, cids)
            out += self._observe_left_out(round_, scores, decided, cids)
        fresh = [b for b in out if b.peer not in self.recommended]
        self.recommended |= {b.peer for b in fresh}
        # A peer recommended by one rule is never recommended again by another.
        self.distance.recommended |= self.recommended
        self.reputation.recommended |= self.recommended
        return sorted(fresh, key=lambda b: b.peer)

    def _observe_left_out(
        self,
        round_: int,
        scores: Mapping[str, UpdateScore],
        decided: Admission,
        cids: Mapping[str, str],
    ) -> list[BanRecommendation]:
        out: list[BanRecommendation] = []
        for peer in sorted(scores):
            # Only a round in which it was left out *on its own data* counts (own standing under
            # the admission bar, or the own floor): an honest peer whose data differ from the
            # rest (its update helps its own data, hurts the held-out split) may sit many rounds
            # out on the held-out bar, and is never named for it (issue 36: a two-class peer).
            own = decided.standing[peer]
            below = own.harm or own.own < -100 * limits.ADMIT_SPREADS
            if peer in self.recommended or peer not in decided.left_out or not below:
                self._left_out.pop(peer, None)
                continue
            streak = self._left_out.setdefault(peer, _Streak())
            streak.rounds.append(round_)
            streak.reasons.append(decided.left_out[peer])
            streak.update_cids.append(cids.get(peer))
            if len(streak.rounds) < limits.LEFT_OUT_BAN_ROUNDS:
                continue
            del self._left_out[peer]
            out.append(
                BanRecommendation(
                    peer,
                    round_,
                    EvidenceKind.LEFT_OUT,
                    f"left out by the scores in {len(streak.rounds)} scored rounds in a row",
                    cids.get(peer),
                    {
                        "rounds": streak.rounds,
                        "reasons": streak.reasons[-3:],
                        "update_cids": streak.update_cids,
                    },
                )
            )
        return out


@dataclass(frozen=True)
class RoundDecision:
    """What :func:`decide_round` decided."""

    inputs: tuple[str, ...]  # the updates the aggregate is taken over (admitted or unscored)
    left_out: dict[str, str]  # decided: peer -> why it is not in the aggregate
    missing: dict[str, str]  # members whose update was not there (not decided)
    aggregate: dict[str, torch.Tensor] | None  # None: the round applies nothing
    partitions: tuple[int, ...]  # the partitions that published (all of them in a full round)
    records: dict[str, PeerRecord]  # per peer, combined over the partitions
    evidence: list[BanRecommendation]  # new ban recommendations of this round
    reputation: dict[str, int]  # after the round

    @property
    def applies(self) -> bool:
        return self.aggregate is not None


def decide_round(
    round_: int,
    members: Sequence[str],
    updates: Mapping[str, Update],
    *,
    expected: Mapping[str, TensorSpec],
    config: AggregatorConfig,
    evidence: RoundEvidence,
    scores: Mapping[str, UpdateScore] | None = None,
    seed: bytes = b"",
    reputation: Mapping[str, int] | None = None,
    partitioned: bool = False,
    segments: int = limits.SEGMENTS,
    update_cids: Mapping[str, str] | None = None,
) -> RoundDecision:
    """Decide one round from its agreed inputs, as the node decides it.

    ``updates``: the members' updates that are there (a member without one that is not left out
    on agreed evidence is missing); ``scores``: the agreed scores (None: the run does not
    score), ``reputation``
    before the round; ``partitioned``: aggregate ``partition_count(members, segments)``
    partitions apart, each published only under :func:`partition_quorum`, as a partitioned
    round's aggregators do; otherwise one aggregate of the whole update, as a full round does.
    ``config``: the rule (``scored_config()`` with scores).
    """
    members = sorted(members)
    if set(updates) - set(members):
        raise AggregationInputError("decide_round: an update from a peer that is not a member")
    invalid = {p: why for p, u in updates.items() if (why := validate_update(u, expected))}
    left_out: dict[str, str] = {}
    decided: Admission | None = None
    inputs = sorted(updates)
    after = dict(reputation or {})
    if scores is not None:
        decided = admission(scores, reputation or {})
        after = decided.reputation
        left_out = dict(decided.left_out)
        # A valid update no scorer scored is left out; an invalid one is passed on, to be
        # rejected with its reason (ban evidence), as the node's aggregators do.
        for p in sorted(set(updates) - set(scores) - set(invalid)):
            left_out[p] = "not scored"
        inputs = sorted([*decided.admitted, *(p for p in invalid if p not in scores)])
    # An admitted update that is not there (an aggregator could not fetch it) is missing.
    inputs = [p for p in inputs if p in updates]
    missing = {m: "no update" for m in members if m not in updates and m not in left_out}
    chosen = {p: updates[p] for p in inputs}
    if partitioned:
        aggregate_, parts, records = _partitioned(chosen, members, len(left_out), expected,
                                                  config, segments)  # fmt: skip
    else:
        aggregate_, parts, records = _full(chosen, expected, config)
    bans = evidence.observe(
        round_, records, update_cids=update_cids, scores=scores, seed=seed, decided=decided
    )
    return RoundDecision(tuple(inputs), left_out, missing, aggregate_, parts, records, bans, after)


def _full(
    chosen: Mapping[str, Update], expected: Mapping[str, TensorSpec], config: AggregatorConfig
) -> tuple[dict[str, torch.Tensor] | None, tuple[int, ...], dict[str, PeerRecord]]:
    if not chosen:
        return None, (), {}
    try:
        result = aggregate(chosen, expected=expected, config=config)
    except NotEnoughUpdatesError:
        return None, (), {}
    return dict(result.tensors), (0,), dict(result.records)


def _partitioned(
    chosen: Mapping[str, Update],
    members: Sequence[str],
    decided: int,
    expected: Mapping[str, TensorSpec],
    config: AggregatorConfig,
    segments: int,
) -> tuple[dict[str, torch.Tensor] | None, tuple[int, ...], dict[str, PeerRecord]]:
    shapes = {name: spec.shape for name, spec in expected.items()}
    numel = sum(spec.numel for spec in expected.values())
    count = min(segments, numel)
    parts = partition_count(len(members), count)
    # Each partition judges its own slice, as the node's aggregators do (a NaN in one partition
    # rejects the update there, and combine_records rejects it for the round); only an update
    # whose layout does not fit cannot be cut into slices at all.
    flats = {p: flat_segments(u, segments) for p, u in chosen.items() if _fits(u, expected)}
    rejected = {p: PeerRecord(p, None, None, validate_update(u, expected) or "malformed")
                for p, u in chosen.items() if p not in flats}  # fmt: skip
    published: list[int] = []
    per_partition: list[Mapping[str, PeerRecord]] = []
    # A partition that publishes nothing applies nothing: its segments stay zero.
    out = [torch.zeros(b - a) for a, b in segment_ranges(numel, segments)]
    for part in range(parts):
        segs = list(partition_segments(count, parts, part))
        slices = {p: torch.cat([f[i] for i in segs]) for p, f in flats.items()}
        records: dict[str, PeerRecord] = dict(rejected)
        result = None
        if partition_quorum(len(slices) + len(rejected), decided, len(members)) and slices:
            try:
                result = aggregate_partition(slices, config)
            except NotEnoughUpdatesError:
                result = None
        if result is None:
            per_partition.append(records)
            continue
        records.update(result.records)
        per_partition.append(records)
        published.append(part)
        values = result.tensors[PARTITION_TENSOR].to(torch.float32)
        offset = 0
        for i in segs:
            n = out[i].numel()
            out[i] = values[offset : offset + n]
            offset += n
    if not published:
        return None, (), combine_records(per_partition)
    return unflatten_segments(out, shapes), tuple(published), combine_records(per_partition)


def _fits(update: Update, expected: Mapping[str, TensorSpec]) -> bool:
    """The update has the expected names and shapes (its values are the partitions' to judge)."""
    return set(update) == set(expected) and all(
        tuple(update[n].shape) == expected[n].shape for n in expected
    )
