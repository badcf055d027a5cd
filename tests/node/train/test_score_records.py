"""Signed score records (node/train/scores/_records.py): the fixture, and every bad input refused
with an error naming what is wrong (specs/training.md#scores-in-partitioned-rounds)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cnode.aggregation import limits as agg_limits
from cnode.auth import Identity, seal
from cnode.node.train import PeerUpdateError, limits
from cnode.node.train.scores._records import (
    BadScoreRecordError,
    ScoreRecord,
    TargetLosses,
    open_score_record,
    score_record_cid,
    seal_score_record,
)

FIXTURES = Path(__file__).resolve().parents[3] / "specs" / "fixtures" / "training"
EXPECTED = json.loads((FIXTURES / "score-record.json").read_text())
ENVELOPE = (FIXTURES / "score-record.cbor").read_bytes()
KEY = Identity.from_seed(bytes.fromhex(EXPECTED["key_seed_hex"]))
TARGET = "12D3KooWB7rYHGsC5PAp7p5tPHJx3WXGUeuRAHZXRpaQr1K1uGJd"


def test_the_fixture_opens_and_reseals_to_the_same_bytes() -> None:
    record = open_score_record(ENVELOPE, run="fixture-run", round_=3, signer=EXPECTED["signer"])
    assert record.to_payload() == EXPECTED["payload"]
    assert str(score_record_cid(ENVELOPE)) == EXPECTED["record_cid"]
    for target, want in EXPECTED["derived_scores"].items():
        got = record.scores[target].score(target)
        assert {"own": got.own, "held": got.held, "score": got.score} == want
    again = ScoreRecord.from_payload(EXPECTED["payload"], KEY.peer_id_str)
    assert seal_score_record(KEY, again) == ENVELOPE


def _payload(**changes: Any) -> dict[str, Any]:
    payload = json.loads(json.dumps(EXPECTED["payload"]))
    payload.update(changes)
    return payload


def _losses(*values: Any) -> dict[str, Any]:
    return {TARGET: [EXPECTED["payload"]["scores"][TARGET][0], *values]}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"extra": 1}, "fields"),
        ({"round": 0}, "round must be an integer >= 1"),
        ({"round": True}, "round must be an integer >= 1"),
        ({"peer": TARGET}, "names another peer than its signer"),
        ({"run": 7}, "run must be a short string"),
        ({"seed": "ab"}, "seed must be 64 hex digits"),
        ({"seed": "zz" * 32}, "bad seed or base"),
        ({"base": "not-a-cid"}, "bad seed or base"),
        ({"scores": []}, "scores must be a map"),
        ({"unscored": {f"p{i}": "x" for i in range(limits.MAX_SCORE_TARGETS + 1)}}, "MAX_SCORE"),
        ({"unscored": {"p": "x" * (limits.MAX_REASON_CHARS + 1)}}, "MAX_REASON_CHARS"),
        ({"unscored": {"": "x"}}, "target peer id is not a short string"),
        ({"scores": {TARGET: [1, 2]}}, "must be [header CID, 4 losses]"),
        ({"scores": {TARGET: ["nope", 1.0, 1.0, 1.0, 1.0]}}, "bad header CID"),
        ({"scores": _losses(1.0, 1.0, 1.0, True)}, "value 4 is not a loss"),
        ({"scores": _losses("-inf", 1.0, 1.0, 1.0)}, "value 1 is not a loss"),
        ({"scores": _losses(1.0, "NaN", 1.0, 1.0)}, "value 2 is not a loss"),
        # Issue 29's record: a finite but extreme loss, out of [0, MAX_SCORE_LOSS].
        ({"scores": _losses(5.0, -1e308, 5.0, 4.9)}, "value 2 is not a loss in [0, MAX_SCORE"),
        ({"scores": _losses(-1.0, 1.0, 1.0, 1.0)}, "value 1 is not a loss"),
        ({"scores": _losses(1.0, 1.0, agg_limits.MAX_SCORE_LOSS * 2, 1.0)}, "value 3 is not"),
        ({"scores": _losses(1.0, 1.0, 1.0, 1e308)}, "value 4 is not a loss"),
        ({"unscored": {TARGET: "x"}}, "both scored and unscored"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(
    changes: dict[str, Any], words: str
) -> None:
    envelope = seal(KEY, "cnode/score-record/v1", _payload(**changes))
    # Signed by its scorer: the refusal is ban evidence (BadScoreRecordError), naming the field.
    with pytest.raises(BadScoreRecordError, match="score record") as caught:
        open_score_record(envelope, run="fixture-run")
    assert words in caught.value.reason
    assert caught.value.peer == KEY.peer_id_str


@pytest.mark.parametrize(
    "losses",
    [
        (0.0, 0.0, 0.0, 0.0),
        (5e-324, "inf", "nan", 5e-324),
        ("inf", 1.0, "nan", "inf"),
        (agg_limits.MAX_SCORE_LOSS, 0.0, 1.0, agg_limits.MAX_SCORE_LOSS),
    ],
)
def test_every_in_range_loss_opens_and_scores_an_integer(losses: tuple[Any, ...]) -> None:
    envelope = seal(KEY, "cnode/score-record/v1", _payload(scores=_losses(*losses)))
    record = open_score_record(envelope, run="fixture-run")
    score = record.scores[TARGET].score(TARGET)
    assert all(isinstance(x, int) for x in (score.own, score.held, score.score))
    assert ScoreRecord.from_payload(record.to_payload(), KEY.peer_id_str) == record or any(
        x == "nan" for x in losses
    )  # NaN != NaN: the payload round-trips, the dataclass compares unequal


def test_measured_losses_are_stated_in_range() -> None:
    header = open_score_record(ENVELOPE, run="fixture-run").scores[TARGET].header
    got = TargetLosses.measured(header, (-0.0, 1e308, math.nan, 2.5))
    assert got.to_payload()[1:] == [0.0, "inf", "nan", 2.5]


def test_a_scorer_never_scores_itself() -> None:
    payload = _payload(unscored={KEY.peer_id_str: "mine"})
    envelope = seal(KEY, "cnode/score-record/v1", payload)
    with pytest.raises(PeerUpdateError, match="never scores its own update"):
        open_score_record(envelope, run="fixture-run")


def test_wrong_signer_run_round_type_and_size_are_refused() -> None:
    other = Identity.generate()
    with pytest.raises(PeerUpdateError, match="bad score record envelope"):
        open_score_record(ENVELOPE, run="fixture-run", signer=other.peer_id_str)
    with pytest.raises(BadScoreRecordError, match="score record is for run 'fixture-run'"):
        open_score_record(ENVELOPE, run="another-run")
    with pytest.raises(BadScoreRecordError, match="score record is for round 3"):
        open_score_record(ENVELOPE, run="fixture-run", round_=4)
    result = seal(KEY, "cnode/partition-result/v1", {"run": "fixture-run"})
    with pytest.raises(PeerUpdateError, match="bad score record envelope"):
        open_score_record(result, run="fixture-run")
    big = ENVELOPE + b"\x00" * limits.MAX_SCORE_RECORD_BYTES
    with pytest.raises(PeerUpdateError, match="too large"):
        open_score_record(big, run="fixture-run")
    tampered = ENVELOPE.replace(b"fixture-run", b"fixture-rum")
    with pytest.raises(PeerUpdateError, match="bad score record envelope"):
        open_score_record(tampered, run="fixture-rum")


def test_only_the_scorer_named_may_seal() -> None:
    record = open_score_record(ENVELOPE, run="fixture-run")
    with pytest.raises(ValueError, match="signed by the scorer it names"):
        seal_score_record(Identity.generate(), record)
