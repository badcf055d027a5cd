"""Scores and reputations in real NodeTrainers (issue 12): a node that trains on corrupted text is
left out at once and recommended for a ban within 3 rounds on evidence that a replay recomputes.

Several NodeTrainers with their own stores exchange blocks by copying them, as in test_round.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cnode.aggregation import limits as agg_limits
from cnode.aggregation import score_seed
from cnode.auth import Identity
from cnode.node.train import ReplayMismatchError, TrainingConfig, replay_checkpoint
from cnode.node.train._trainer import NodeTrainer
from cnode.node.train.scores._scoring import check_recorded_scores
from cnode.storage import BlockStore, read_manifest
from tests.support.trainers import play_full_round

CONFIG = TrainingConfig.from_dict(
    {"local_steps": 16, "batch_size": 4, "scores": True, "partitioned": "never"}
)


def _rounds_of(node: NodeTrainer, cid: Any) -> list[Any]:
    manifest = read_manifest(node.store, cid)
    meta = getattr(manifest, "meta", manifest)
    return list(meta.aggregation.params["rounds"])


@pytest.mark.slow
def test_a_node_training_on_flipped_tokens_is_left_out_and_its_reputation_falls(
    tmp_path: Path,
) -> None:
    """Revision 4 (issue 24): the attacker is left out of every aggregate by its standings and
    its reputation (an EMA of standings, in hundredths of a spread) falls every round; no honest
    peer is recommended. A ban takes REPUTATION_BAN_ROUNDS rounds below BAN_REPUTATION, which an
    EMA started at 0 reaches from round 7 (tests/node/coordinator/test_reputation_evidence.py
    plays those rounds); every recorded score replays."""
    nodes = [
        NodeTrainer(
            CONFIG,
            run="r1",
            # Fixed identities: shards follow peer ids, so random ones made the test's layout,
            # and with it which honest update helps its own data, change from run to run.
            identity=Identity.from_seed(bytes([40 + i]) * 32),
            store=BlockStore(tmp_path / f"n{i}"),
            attack="flipped_tokens" if i == 0 else None,
        )
        for i in range(4)
    ]
    attacker, honest = nodes[0].peer, nodes[1:]
    for round_ in (1, 2, 3):
        outcomes = play_full_round(nodes, round_)
        assert len({node.state_cid for node in nodes}) == 1  # the attacker's node agrees too
        for outcome in outcomes:
            assert attacker not in outcome.members  # never aggregated
            # An honest update that does not measurably help its own data may sit a round out.
            assert 2 * len(outcome.members) >= len(honest)
            assert all(ban.peer == attacker for ban in outcome.bans)  # no honest peer, ever
        if round_ == 2:
            first = nodes[1].store_checkpoint()
            for node in nodes:
                node.checkpoint, node.since_checkpoint = first, []

    # Every score, admission and reputation replays from both checkpoints.
    second = nodes[1].store_checkpoint()
    replay_checkpoint(nodes[1].store, first)
    replay_checkpoint(nodes[1].store, second)
    rounds = _rounds_of(nodes[1], first) + _rounds_of(nodes[1], second)
    reps = [row[1]["scores"]["reputation"][attacker] for row in rounds]
    assert all(r < 0 for r in reps), reps  # below every honest start (0) from round 1
    assert all(attacker not in row[1]["scores"]["admitted"] for row in rounds)
    # The seed is sha256 over the round's header CIDs, which the checkpoint lists.
    manifest = read_manifest(nodes[1].store, first)
    headers = [str(c) for c in getattr(manifest, "meta", manifest).aggregation.updates]
    assert score_seed(headers[: len(nodes)]).hex() == rounds[0][1]["scores"]["seed"]

    # A record whose scores were altered does not replay.
    tampered = [[n, dict(p)] for n, p in rounds[:2]]
    scores = dict(tampered[0][1]["scores"])
    scores["reputation"] = {**scores["reputation"], attacker: 0}
    tampered[0][1]["scores"] = scores
    with pytest.raises(ReplayMismatchError, match="reputation"):
        check_recorded_scores(tampered, {n: p for n, p in rounds[:2]})
    assert agg_limits.REPUTATION_BAN_ROUNDS == 3


def test_data_attacks_corrupt_the_training_text_only() -> None:
    from cnode.node.train.model._corrupt import DATA_ATTACKS, corrupt_data
    from cnode.node.train.model._data import TextData

    config = TrainingConfig()
    data = TextData.build(config.data, config.model)
    vocab = config.model.vocab_size
    flipped = corrupt_data(data, "flipped_tokens", vocab)
    assert bool(((vocab - 1) - flipped.train == data.train).all())
    shuffled = corrupt_data(data, "shuffled_tokens", vocab)
    assert bool((shuffled.train.sort(dim=1).values == data.train.sort(dim=1).values).all())
    assert not bool((shuffled.train == data.train).all())
    for bad in (flipped, shuffled):
        assert bad.eval is data.eval and bad.n_shards == data.n_shards  # scored on true data
    assert set(DATA_ATTACKS) == {"flipped_tokens", "shuffled_tokens"}
    with pytest.raises(ValueError, match="unknown data attack"):
        corrupt_data(data, "bogus", vocab)


def test_scores_setting_round_trips_and_is_recorded_when_off() -> None:
    on = TrainingConfig.from_dict({"scores": True, "partitioned": "never"})
    assert on.scores and TrainingConfig.from_dict(on.to_dict()) == on
    off = TrainingConfig(scores=False)
    assert off.to_dict()["scores"] is False  # a record says it, on or off
    assert TrainingConfig.from_dict(off.to_dict()) == off
    assert TrainingConfig().scores and TrainingConfig.for_run({}) == TrainingConfig()  # a run's
