"""Scores spread over a partitioned round's members (node/train/scores/_spread.py): who scores
whom, agreement, disputes recomputed, wrong scorers named, admission (specs/training.md
#scores-in-partitioned-rounds). Pure: records are built and signed here, no network."""

from __future__ import annotations

import pytest

from cnode.aggregation import AggregationInputError, EvidenceKind, score_assignment, score_seed
from cnode.auth import Identity
from cnode.node.train import limits
from cnode.node.train.scores import SpreadRecords
from cnode.node.train.scores._records import ScoreRecord, TargetLosses
from cnode.node.train.scores._spread import (
    INVALID_PREFIX,
    disputed_targets,
    resolve_scores,
    scorers_of,
    targets_of,
)
from cnode.storage import CID, DAG_CBOR, compute_cid

RUN, ROUND = "spread-run", 5
KEYS = [Identity.from_seed(bytes([i]) * 32) for i in range(5)]
MEMBERS = sorted(k.peer_id_str for k in KEYS)
HEADERS = {m: compute_cid(f"header of {m}".encode(), DAG_CBOR) for m in MEMBERS}
BASE = compute_cid(b"parent state", DAG_CBOR)
SEED = score_seed(str(c) for c in HEADERS.values())
GOOD = (4.0, 3.6, 4.0, 3.9)  # own 1000 units better, held 250 units better
BAD = (4.0, 4.4, 4.0, 4.8)  # own 1000 units worse, held 2000 units worse


def _losses(target: str, values: tuple[float, float, float, float]) -> TargetLosses:
    return TargetLosses(HEADERS[target], *values)


def _records(
    claims: dict[str, dict[str, tuple[float, float, float, float]]],
    *,
    seed: bytes = SEED,
    base: CID = BASE,
) -> dict[str, tuple[CID, ScoreRecord]]:
    """scorer -> its record; a scorer claims GOOD for every target unless ``claims`` says."""
    out = {}
    for scorer in MEMBERS:
        targets = targets_of(RUN, ROUND, MEMBERS, scorer)
        values = {t: claims.get(scorer, {}).get(t, GOOD) for t in targets}
        record = ScoreRecord(
            RUN, ROUND, scorer, base, seed, {t: _losses(t, v) for t, v in values.items()}, {}
        )
        out[scorer] = (compute_cid(scorer.encode(), DAG_CBOR), record)
    return out


def _resolve(records: dict[str, tuple[CID, ScoreRecord]], recompute=None, reputation=None):  # type: ignore[no-untyped-def]
    def never(target: str) -> TargetLosses:
        raise AssertionError(f"recomputed {target} without a dispute")

    return resolve_scores(
        SpreadRecords(RUN, ROUND, MEMBERS, HEADERS, BASE, SEED, records),
        reputation=reputation or {}, recompute=recompute or never,
    )  # fmt: skip


def test_every_member_has_scorers_per_update_scorers_never_itself() -> None:
    scorers = scorers_of(RUN, ROUND, MEMBERS)
    assert set(scorers) == set(MEMBERS)
    for target, who in scorers.items():
        assert len(who) == limits.SCORERS_PER_UPDATE and target not in who
        assert len(set(who)) == len(who)
    for scorer in MEMBERS:
        assert len(targets_of(RUN, ROUND, MEMBERS, scorer)) == limits.SCORERS_PER_UPDATE
    assert targets_of(RUN, ROUND, MEMBERS, "not-a-member") == []
    # Two members: each scores the other only; the order changes with the round.
    assert score_assignment(["a", "b"], 2) == {"a": ["b"], "b": ["a"]}
    assert scorers_of(RUN, ROUND, MEMBERS) != scorers_of(RUN, ROUND + 1, MEMBERS)
    with pytest.raises(AggregationInputError, match="distinct"):
        score_assignment(["a", "a"], 2)


def test_agreeing_scorers_give_the_scores_and_a_bad_update_is_left_out() -> None:
    attacker = MEMBERS[2]
    claims = {s: {attacker: BAD} for s in scorers_of(RUN, ROUND, MEMBERS)[attacker]}
    spread = _resolve(_records(claims))
    assert set(spread.scores) == set(MEMBERS)
    assert spread.scores[attacker].score < 0 < spread.scores[MEMBERS[0]].score
    assert attacker not in spread.admitted and attacker not in spread.inputs
    assert spread.left_out[attacker].startswith("left out by scores: ")
    assert spread.inputs == tuple(m for m in MEMBERS if m != attacker)
    assert spread.reputation[attacker] < 0 and spread.wrong == ()
    params = spread.to_params()
    assert params["seed"] == SEED.hex() and params["admitted"] == list(spread.admitted)
    assert set(params["records"]) == set(MEMBERS)


def test_a_dispute_is_recomputed_and_the_wrong_scorer_named() -> None:
    target = MEMBERS[0]
    liar, honest = scorers_of(RUN, ROUND, MEMBERS)[target]
    records = _records({liar: {target: BAD}})
    common = SpreadRecords(RUN, ROUND, MEMBERS, HEADERS, BASE, SEED, records)
    assert disputed_targets(common) == [target]
    asked: list[str] = []

    def recompute(t: str) -> TargetLosses:
        asked.append(t)
        return _losses(t, GOOD)

    spread = _resolve(records, recompute)
    assert asked == [target]
    assert target in spread.admitted
    (ban,) = spread.wrong
    assert ban.peer == liar and ban.round == ROUND
    assert ban.kind is EvidenceKind.WRONG_SCORE and target[-8:] in ban.reason
    assert ban.update_cid == str(records[liar][0])  # the offending signed record
    assert ban.figures["seed"] == SEED.hex() and ban.figures["target_header"] == str(
        HEADERS[target]
    )
    assert ban.figures["recomputed"] == [4.0, 3.6, 4.0, 3.9]
    assert honest not in {b.peer for b in spread.wrong}


def test_unscored_updates_are_left_out_and_invalid_ones_passed_to_be_rejected() -> None:
    quiet, broken = MEMBERS[1], MEMBERS[3]
    records = _records({})
    for scorer in scorers_of(RUN, ROUND, MEMBERS)[quiet]:
        del records[scorer]  # neither scorer of `quiet` reported
    for scorer in scorers_of(RUN, ROUND, MEMBERS)[broken]:
        if scorer not in records:
            continue
        cid, r = records[scorer]
        scores = {t: x for t, x in r.scores.items() if t != broken}
        records[scorer] = (cid, ScoreRecord(RUN, ROUND, scorer, BASE, SEED, scores,
                                             {broken: INVALID_PREFIX + "value nan"}))  # fmt: skip
    spread = _resolve(records)
    assert quiet not in spread.inputs and "not scored" in spread.left_out[quiet]
    assert broken in spread.inputs and broken not in spread.admitted  # rejected by aggregators
    assert broken not in spread.scores


def test_records_of_another_seed_base_or_header_say_nothing() -> None:
    target = MEMBERS[4]
    spread = _resolve(_records({}, seed=bytes(32)))
    assert spread.scores == {} and spread.inputs == ()
    spread = _resolve(_records({}, base=compute_cid(b"another state", DAG_CBOR)))
    assert spread.scores == {}
    records = _records({})
    for scorer in scorers_of(RUN, ROUND, MEMBERS)[target]:
        cid, r = records[scorer]
        wrong_header = TargetLosses(HEADERS[MEMBERS[0]], *GOOD)
        records[scorer] = (cid, ScoreRecord(RUN, ROUND, scorer, BASE, SEED,
                                             {**r.scores, target: wrong_header}, {}))  # fmt: skip
    spread = _resolve(records)
    assert target not in spread.scores and target in spread.left_out


def test_reputation_keeps_a_repeat_offender_out_even_with_a_passing_score() -> None:
    attacker = MEMBERS[2]
    spread = _resolve(_records({}), reputation={attacker: -400})
    assert spread.scores[attacker].score >= 0
    assert attacker not in spread.admitted
    assert "reputation" in spread.left_out[attacker]


def test_a_refused_record_says_nothing_and_its_signer_is_named() -> None:
    """Issue 29: a record whose signature verified but whose content did not decode (an
    out-of-range loss) is left out like a missing one; its scorer is named with the record's
    CID as evidence, and the round's scores come from the other records."""
    records = _records({})
    bad = MEMBERS[1]
    cid = records.pop(bad)[0]
    why = "losses of x: value 2 is not a loss in [0, MAX_SCORE_LOSS] or 'inf' / 'nan': '-1e308'"
    spread = resolve_scores(
        SpreadRecords(RUN, ROUND, MEMBERS, HEADERS, BASE, SEED, records),
        reputation={}, recompute=lambda t: _losses(t, GOOD),
        refused={bad: (cid, why)},
    )  # fmt: skip
    assert [(w.peer, w.update_cid) for w in spread.wrong] == [(bad, str(cid))]
    assert spread.wrong[0].kind is EvidenceKind.BAD_SCORE_RECORD
    assert spread.wrong[0].figures == {"score_record": str(cid)}
    assert bad not in spread.to_params()["records"]
    # Its targets keep the score of their other scorer (every member has two).
    assert set(spread.scores) == set(MEMBERS)
