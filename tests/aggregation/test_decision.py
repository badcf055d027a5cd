"""The round decision (issue 36): the partition quorum counts rejected updates as decided, bans
with scores on never rest on distance alone, a peer left out round after round is named, and
``decide_round`` decides a full and a partitioned round alike."""

from __future__ import annotations

import pytest
import torch

from cnode.aggregation import (
    ATTACKS,
    AggregationInputError,
    AggregatorConfig,
    EvidenceKind,
    PeerRecord,
    RoundEvidence,
    UpdateScore,
    admission,
    decide_round,
    limits,
    partition_quorum,
    score_update,
    scored_config,
)

from .conftest import SPEC, make_updates

MEMBERS = [f"peer{i:02d}" for i in range(10)]


def _score(peer: str, own: float, held: float = 0.01) -> UpdateScore:
    """An update whose own-data loss went from 1 to 1 - own, held-out from 1 to 1 - held."""
    return score_update(peer, 1.0, 1.0 - own, 1.0, 1.0 - held)


def test_rejected_attackers_are_decided_not_missing() -> None:
    # 10 members, 4 attackers left out by the scores, 1 honest update not fetched: 5 inputs.
    assert partition_quorum(inputs=5, decided=4, members=10)
    # The rule before issue 36 (inputs alone a strict majority) froze exactly this round.
    assert not 2 * 5 > 10
    # A node cut off from most of the swarm still cannot publish its own few updates.
    assert not partition_quorum(inputs=2, decided=3, members=10)
    assert not partition_quorum(inputs=1, decided=0, members=2)
    assert partition_quorum(inputs=0, decided=3, members=5)  # all decided: publishes nothing new
    with pytest.raises(AggregationInputError, match=">= 0"):
        partition_quorum(-1, 0, 3)


def test_admission_is_the_one_place_scores_become_a_decision() -> None:
    scores = {p: _score(p, 0.05 + 0.001 * i) for i, p in enumerate(MEMBERS[:6])}
    scores |= {p: _score(p, -0.05) for p in MEMBERS[6:]}  # they made their own data worse
    decided = admission(scores, {})
    assert decided.admitted == tuple(MEMBERS[:6])
    assert set(decided.left_out) == set(MEMBERS[6:])
    assert all(why.startswith("left out by scores: own-data score below the own floor")
               for why in decided.left_out.values())  # fmt: skip
    assert all(decided.standing[p].harm for p in MEMBERS[6:])
    assert decided.reputation[MEMBERS[9]] < 0 <= decided.reputation[MEMBERS[0]]


def _far_honest_round(rnd: int) -> dict[str, PeerRecord]:
    """peer09's data differ: it sits 5x the median distance from the centre every round."""
    records = {p: PeerRecord(p, 1.0, 1.0, None, score=1.0) for p in MEMBERS[:9]}
    records["peer09"] = PeerRecord("peer09", 5.0, 0.2, None, score=5.0, outlier=True)
    return records


def test_with_scores_distance_alone_bans_nobody_without_it_it_does() -> None:
    scored, unscored = RoundEvidence(scored=True), RoundEvidence(scored=False)
    scores = {p: _score(p, 0.05 + 0.001 * i) for i, p in enumerate(MEMBERS)}
    found_scored, found_unscored = [], []
    reputation: dict[str, int] = {}
    for rnd in range(1, 8):
        decided = admission(scores, reputation)
        reputation = decided.reputation
        found_scored += scored.observe(
            rnd, _far_honest_round(rnd), scores=scores, seed=b"s" * 32, decided=decided
        )
        found_unscored += unscored.observe(rnd, _far_honest_round(rnd))
    assert found_scored == []  # its update helps its own data: no evidence of harm
    assert [(b.peer, b.kind) for b in found_unscored] == [("peer09", EvidenceKind.OUTLIER)]


def test_a_peer_left_out_round_after_round_is_named_once_and_a_break_resets_it() -> None:
    evidence = RoundEvidence(scored=True)
    reputation: dict[str, int] = {}
    found = []
    for rnd in range(1, 3 * limits.LEFT_OUT_BAN_ROUNDS):
        scores = {p: _score(p, 0.05 + 0.001 * i, 0.01 + 0.001 * i) for i, p in enumerate(MEMBERS)}
        # peer08 sends a useless update: it helps its own data a little (no harm, so no
        # reputation ban) and is left out on its own data every round. The stall attacker.
        scores["peer08"] = _score("peer08", 0.001)
        # peer07: the same, but admitted once in the middle of its streak.
        gap = rnd == limits.LEFT_OUT_BAN_ROUNDS // 2
        scores["peer07"] = _score("peer07", 0.05 if gap else 0.001)
        # peer06: its data differ: it helps its own data as much as anyone and hurts the
        # held-out split. Left out every round on the held-out bar, never named for it.
        scores["peer06"] = _score("peer06", 0.0555, held=-0.5)
        decided = admission(scores, reputation)
        reputation = decided.reputation
        assert ("peer07" in decided.admitted) == gap and "peer08" not in decided.admitted
        assert "peer06" in decided.left_out and not decided.standing["peer06"].harm
        found += evidence.observe(
            rnd, {}, scores=scores, seed=b"s" * 32, decided=decided,
            update_cids={p: f"bafk-{p}-{rnd}" for p in scores},
        )  # fmt: skip
    kinds = {(b.peer, b.kind, b.round) for b in found}
    n = limits.LEFT_OUT_BAN_ROUNDS
    assert kinds == {
        ("peer08", EvidenceKind.LEFT_OUT, n),
        ("peer07", EvidenceKind.LEFT_OUT, n // 2 + n),
    }
    (first,) = [b for b in found if b.peer == "peer08"]
    assert first.figures["rounds"] == list(range(1, n + 1))
    assert first.update_cid == f"bafk-peer08-{n}"
    assert "own-data score" in first.figures["reasons"][-1]
    assert first.to_payload()["kind"] == "left_out"


def test_a_rejected_update_is_evidence_at_once_with_or_without_scores() -> None:
    for scored in (True, False):
        evidence = RoundEvidence(scored=scored)
        records = {"peer01": PeerRecord("peer01", None, None, "tensor 'w' is not finite")}
        (rec,) = evidence.observe(3, records, update_cids={"peer01": "bafk-x"})
        assert rec.kind is EvidenceKind.REJECTED and rec.round == 3
        assert evidence.observe(4, records) == []  # once


def _attacked(n_bad: int, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    updates = make_updates(10, seed=seed)
    honest = [updates[p] for p in MEMBERS[: 10 - n_bad]]
    for p in MEMBERS[10 - n_bad :]:
        updates[p] = ATTACKS["sign_flip"](honest, updates[p], torch.Generator(), 10, n_bad)
    return updates


def _scores_rejecting(bad: list[str]) -> dict[str, UpdateScore]:
    return {p: _score(p, -0.2 if p in bad else 0.05 + 0.001 * i) for i, p in enumerate(MEMBERS)}


def test_four_rejected_attackers_and_one_lost_update_do_not_stall_a_partitioned_round() -> None:
    updates = _attacked(4)
    bad = MEMBERS[6:]
    lost = "peer00"  # an honest update that did not arrive
    del updates[lost]
    decision = decide_round(
        1, MEMBERS, updates, expected=SPEC, config=scored_config(),
        evidence=RoundEvidence(scored=True), scores=_scores_rejecting(bad), partitioned=True,
    )  # fmt: skip
    assert decision.applies
    assert decision.inputs == tuple(MEMBERS[1:6])
    assert set(decision.left_out) == set(bad)
    assert len(decision.partitions) == 10  # every partition published
    assert decision.missing == {lost: "no update"}
    # Six honest updates lost: the aggregator is cut off, no partition publishes.
    cut = {p: u for p, u in _attacked(4).items() if p in MEMBERS[:4]}
    cut_off = decide_round(
        1, MEMBERS, cut, expected=SPEC, config=scored_config(),
        evidence=RoundEvidence(scored=True),
        scores={p: s for p, s in _scores_rejecting(bad).items() if p in cut}, partitioned=True,
    )  # fmt: skip
    assert not cut_off.applies and cut_off.partitions == ()


def test_a_full_and_a_partitioned_decision_admit_the_same_and_the_mean_agrees() -> None:
    updates = _attacked(3, seed=4)
    scores = _scores_rejecting(MEMBERS[7:])
    mean = AggregatorConfig("mean")
    full, part = [
        decide_round(1, MEMBERS, updates, expected=SPEC, config=mean, scores=scores,
                     evidence=RoundEvidence(scored=True), partitioned=partitioned)
        for partitioned in (False, True)
    ]  # fmt: skip
    assert full.inputs == part.inputs == tuple(MEMBERS[:7])
    assert full.left_out == part.left_out
    assert full.reputation == part.reputation
    assert full.aggregate is not None and part.aggregate is not None
    for name in SPEC:  # the mean is coordinate-wise: the partitions give the same values
        torch.testing.assert_close(full.aggregate[name], part.aggregate[name], rtol=0, atol=1e-6)
    with pytest.raises(AggregationInputError, match="not a member"):
        decide_round(1, MEMBERS[:3], updates, expected=SPEC, config=AggregatorConfig("mean"),
                     evidence=RoundEvidence(scored=False))  # fmt: skip
