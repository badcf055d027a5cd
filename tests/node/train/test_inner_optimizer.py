"""The local AdamW's moments across rounds (``training.inner_optimizer_state``): the setting, what
"keep" changes in an update, its determinism, and what a restart or catch-up does with them.

Real models, data, trainers and stores; the "nodes" exchange blocks by copying them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from cnode.auth import Identity
from cnode.node.train import TrainingConfig, TrainingConfigError, limits, memory_need
from cnode.node.train._trainer import NodeTrainer
from cnode.node.train.model import (
    InnerMoments,
    TextData,
    build_model,
    model_state,
    train_local,
)
from cnode.storage import BlockStore
from tests.support.trainers import copy_closure, play_full_round, tiny_config

KEEP = tiny_config(scores=False)
FRESH = tiny_config(scores=False, inner_optimizer_state="fresh")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


# -- the setting --------------------------------------------------------------------------------


def test_new_runs_keep_the_moments_and_old_records_stay_fresh() -> None:
    assert TrainingConfig.for_run({}).inner_optimizer_state == "keep"
    # A record without the key (every checkpoint made before it) trained fresh: it still means so,
    # and a fresh run records the same table as before the key existed.
    old = TrainingConfig.from_dict({})
    assert old.inner_optimizer_state == "fresh"
    assert "inner_optimizer_state" not in old.to_dict()
    assert KEEP.to_dict()["inner_optimizer_state"] == "keep"
    assert TrainingConfig.from_dict(KEEP.to_dict()) == KEEP
    assert TrainingConfig.from_dict(FRESH.to_dict()) == FRESH


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("reset", "training.inner_optimizer_state 'reset' is not one of keep, fresh"),
        ("", "training.inner_optimizer_state '' is not one of keep, fresh"),
        (True, r"\[training\] inner_optimizer_state must be str, got True"),
    ],
)
def test_a_bad_inner_optimizer_state_is_refused_naming_the_field(value: object, named: str) -> None:
    with pytest.raises(TrainingConfigError, match=named):
        TrainingConfig.for_run({"inner_optimizer_state": value})
    with pytest.raises(TrainingConfigError, match=named):
        TrainingConfig.from_dict({"inner_optimizer_state": value})


def test_kept_moments_count_two_more_buffers_outside_training() -> None:
    fresh, kept = memory_need(1000), memory_need(1000, inner_moments=True)
    assert kept.training_bytes == fresh.training_bytes  # AdamW's moments were counted there
    assert kept.round_bytes - fresh.round_bytes == limits.INNER_MOMENT_BUFFERS * 1000 * 4
    assert "(9 buffers)" in kept.describe()


# -- local steps --------------------------------------------------------------------------------


def _setup() -> tuple[torch.nn.Module, dict[str, torch.Tensor], TextData]:
    model = build_model(KEEP)
    return model, model_state(model), TextData.build(KEEP.data, KEEP.model)


def test_kept_moments_change_the_second_rounds_update_and_only_it() -> None:
    model, state, data = _setup()
    moments = InnerMoments()
    first = train_local(model, state, data, KEEP, peer_id="p", round_=1, moments=moments)
    fresh_first = train_local(model, state, data, KEEP, peer_id="p", round_=1)
    assert _same(first.delta, fresh_first.delta)  # no history yet: the same steps
    assert moments and set(moments.tensors) == set(state)
    assert all(int(s["step"]) == KEEP.local_steps for s in moments.tensors.values())

    second = {k: state[k] + first.delta[k] for k in state}
    kept = train_local(model, second, data, KEEP, peer_id="p", round_=2, moments=moments)
    fresh = train_local(model, second, data, KEEP, peer_id="p", round_=2)
    assert not _same(kept.delta, fresh.delta)
    assert all(int(s["step"]) == 2 * KEEP.local_steps for s in moments.tensors.values())


def test_an_update_is_a_function_of_state_moments_shard_and_round() -> None:
    model, state, data = _setup()
    moments = InnerMoments()
    train_local(model, state, data, KEEP, peer_id="p", round_=1, moments=moments)
    again = copy.deepcopy(moments)
    a = train_local(model, state, data, KEEP, peer_id="p", round_=2, moments=moments)
    b = train_local(model, state, data, KEEP, peer_id="p", round_=2, moments=again)
    assert _same(a.delta, b.delta)
    assert all(
        _same(moments.tensors[n], again.tensors[n]) for n in moments.tensors
    )  # and so are the moments it leaves


def test_moments_that_do_not_fit_the_model_are_dropped_not_used() -> None:
    model, state, data = _setup()
    moments = InnerMoments()
    train_local(model, state, data, KEEP, peer_id="p", round_=1, moments=moments)
    name = next(iter(moments.tensors))
    moments.tensors[name]["exp_avg"] = torch.zeros(3)  # another model's, or a damaged one
    got = train_local(model, state, data, KEEP, peer_id="p", round_=2, moments=moments)
    fresh = train_local(model, state, data, KEEP, peer_id="p", round_=2)
    assert _same(got.delta, fresh.delta)
    assert moments and moments.tensors[name]["exp_avg"].shape == state[name].shape


# -- a node ----------------------------------------------------------------------------------


def _node(tmp_path: Path, name: str, config: TrainingConfig = KEEP) -> NodeTrainer:
    return NodeTrainer(
        config, run="r1", identity=Identity.generate(), store=BlockStore(tmp_path / name)
    )


def test_a_node_keeps_its_moments_and_a_restart_starts_them_fresh(tmp_path: Path) -> None:
    nodes = [_node(tmp_path, "a"), _node(tmp_path, "b")]
    assert _node(tmp_path, "f", FRESH).moments is None
    for round_ in (1, 2):
        play_full_round(nodes, round_)
    assert len({n.state_cid for n in nodes}) == 1
    a = nodes[0]
    assert a.moments and int(next(iter(a.moments.tensors.values()))["step"]) == 4
    cid = a.store_checkpoint()
    a.store.pin(a.pin_name, cid)

    # A restart is a new process: it resumes the checkpoint with no moments, as a late joiner
    # or a node catching up does; its next update is the fresh-moments update of that state.
    restarted = NodeTrainer(KEEP, run="r1", identity=a.identity, store=a.store)
    restarted.resume_checkpoint(cid)
    assert restarted.state_cid == a.state_cid and not restarted.moments
    # The same peer (so the same shard and batches) in a run that starts every round fresh.
    fresh = NodeTrainer(FRESH, run="r1", identity=a.identity, store=BlockStore(tmp_path / "g"))
    copy_closure(a.store, fresh.store, cid)
    fresh.adopt_checkpoint(cid)
    got, want = restarted.train(3), fresh.train(3)
    assert got.header.update == want.header.update
    kept = a.train(3)  # the node that did not restart trains round 3 with its moments
    assert kept.header.update != got.header.update

    # Adopting a checkpoint (catch-up) drops the moments too: they came from other rounds.
    b = nodes[1]
    assert b.moments
    copy_closure(a.store, b.store, cid)
    b.adopt_checkpoint(cid)
    assert not b.moments
