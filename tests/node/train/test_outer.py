"""The outer optimizer (issue 26): settings, the Nesterov step, and its momentum as run state.

The momentum buffer is computed on every node, stored in each checkpoint, taken over by a late
joiner and recomputed by replay, bit for bit. Real trainers, stores, signatures and replay; the
"nodes" exchange blocks by copying them, as in test_round.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cnode.auth import Identity
from cnode.node.train import (
    CatchUpError,
    ReplayMismatchError,
    TrainingConfig,
    TrainingConfigError,
    replay_checkpoint,
)
from cnode.node.train._trainer import NodeTrainer
from cnode.node.train.model import (
    MOMENTUM_PREFIX,
    outer_step,
    outer_step_flat,
    split_momentum,
    zero_momentum,
)
from cnode.storage import BlockStore, load_checkpoint
from tests.support.trainers import copy_closure, play_full_round, tiny_config

NESTEROV = tiny_config(scores=False, outer_optimizer="nesterov")


# -- settings ---------------------------------------------------------------------------------


def test_nesterov_takes_dilocos_defaults_and_sgd_keeps_old_bytes() -> None:
    assert (NESTEROV.outer_lr, NESTEROV.outer_momentum) == (0.7, 0.9)
    given = TrainingConfig.from_dict({"outer_optimizer": "nesterov", "outer_lr": 0.5})
    assert (given.outer_lr, given.outer_momentum) == (0.5, 0.9)
    plain = TrainingConfig.from_dict({})
    assert (plain.outer_optimizer, plain.outer_lr, plain.outer_momentum) == ("sgd", 1.0, 0.0)
    # A run without the new keys records the same [training] table as before them.
    assert not {"outer_optimizer", "outer_momentum", "precision"} & set(plain.to_dict())
    assert TrainingConfig.from_dict(NESTEROV.to_dict()) == NESTEROV


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (
            {"outer_optimizer": "adam"},
            "training.outer_optimizer 'adam' is not one of sgd, nesterov",
        ),
        ({"outer_optimizer": "nesterov", "outer_momentum": 1.0}, "training.outer_momentum 1.0"),
        ({"outer_optimizer": "nesterov", "outer_momentum": -0.1}, "training.outer_momentum -0.1"),
        ({"outer_optimizer": "nesterov", "outer_momentum": float("nan")}, "outer_momentum nan"),
        ({"outer_momentum": 0.9}, "training.outer_momentum is for outer_optimizer"),
        ({"outer_optimizer": 3}, "outer_optimizer must be str"),
        ({"precision": "fp16"}, "training.precision 'fp16' is not one of fp32, bf16-mixed"),
    ],
)
def test_a_bad_outer_setting_is_refused_naming_the_field(
    raw: dict[str, object], named: str
) -> None:
    with pytest.raises(TrainingConfigError) as info:
        TrainingConfig.for_run(raw)
    assert named in str(info.value)


# -- the step ---------------------------------------------------------------------------------


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(3, 5, generator=gen), "b": torch.randn(7, generator=gen)}


def test_nesterov_step_is_torchs_nesterov_sgd_on_the_negated_aggregate() -> None:
    state, momentum = _tensors(0), _tensors(1)
    aggregate = _tensors(2)
    new, new_m = outer_step(state, momentum, aggregate, NESTEROV)
    assert new_m is not None
    for name, t in state.items():
        param = torch.nn.Parameter(t.clone())
        sgd = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
        sgd.state[param]["momentum_buffer"] = -momentum[name].clone()
        param.grad = -aggregate[name].clone()
        sgd.step()
        torch.testing.assert_close(new[name], param.detach(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(new_m[name], -sgd.state[param]["momentum_buffer"])


def test_the_partitioned_step_gives_the_full_steps_bytes() -> None:
    state, momentum, aggregate = _tensors(3), _tensors(4), _tensors(5)
    new, new_m = outer_step(state, momentum, aggregate, NESTEROV)
    assert new_m is not None
    names = sorted(state)
    flat = torch.cat([state[n].reshape(-1) for n in names])
    flat_m = torch.cat([momentum[n].reshape(-1) for n in names])
    values = torch.cat([aggregate[n].reshape(-1) for n in names])
    for start in range(0, flat.numel(), 4):  # segment by segment, as partitions apply
        stop = min(start + 4, flat.numel())
        outer_step_flat(flat, flat_m, start, stop, values[start:stop], NESTEROV)
    assert torch.equal(flat, torch.cat([new[n].reshape(-1) for n in names]))
    assert torch.equal(flat_m, torch.cat([new_m[n].reshape(-1) for n in names]))


# -- momentum as run state ----------------------------------------------------------------


def _node(tmp_path: Path, name: str, config: TrainingConfig = NESTEROV) -> NodeTrainer:
    return NodeTrainer(
        config, run="r1", identity=Identity.generate(), store=BlockStore(tmp_path / name)
    )


def _same_momentum(nodes: list[NodeTrainer]) -> bool:
    first = nodes[0].momentum
    assert first is not None
    return all(
        n.momentum is not None and all(torch.equal(first[k], n.momentum[k]) for k in first)
        for n in nodes[1:]
    )


def test_momentum_survives_a_checkpoint_a_late_join_and_replay(tmp_path: Path) -> None:
    nodes = [_node(tmp_path, f"n{i}") for i in range(2)]
    for round_ in (1, 2):
        play_full_round(nodes, round_)
    assert len({n.state_cid for n in nodes}) == 1 and _same_momentum(nodes)
    assert nodes[0].momentum is not None
    assert any(t.abs().sum() > 0 for t in nodes[0].momentum.values())  # it did move
    first = {n.store_checkpoint() for n in nodes}
    assert len(first) == 1  # momentum layers included, every node stores the same manifest
    (cid,) = first
    stored, manifest = load_checkpoint(nodes[0].store, cid)
    _, momentum = split_momentum(stored)
    assert momentum is not None and all(
        torch.equal(momentum[k], nodes[0].momentum[k]) for k in momentum
    )
    extra = manifest.meta.extra if hasattr(manifest, "meta") else manifest.extra
    assert extra["training"]["outer_optimizer"] == "nesterov"

    late = _node(tmp_path, "late")  # takes the checkpoint over, momentum and all
    copy_closure(nodes[0].store, late.store, cid)
    late.adopt_checkpoint(cid)
    nodes.append(late)
    assert _same_momentum(nodes) and len({n.state_cid for n in nodes}) == 1
    play_full_round(nodes, 3)
    assert len({n.state_cid for n in nodes}) == 1 and _same_momentum(nodes)

    second = nodes[0].store_checkpoint()
    report = replay_checkpoint(nodes[0].store, second)  # from the parent's stored momentum
    assert report.rounds == (3,) and report.state_cid == nodes[0].state_cid
    assert replay_checkpoint(nodes[0].store, cid).rounds == (1, 2)  # from zeros at genesis


def test_replay_names_a_tampered_momentum_and_a_joiner_refuses_a_missing_one(
    tmp_path: Path,
) -> None:
    nodes = [_node(tmp_path, "a")]
    play_full_round(nodes, 1)
    node = nodes[0]
    assert node.momentum is not None
    name = sorted(node.momentum)[0]
    node.momentum[name] = node.momentum[name] + 1.0  # a checkpointer that stores a wrong buffer
    cid = node.store_checkpoint()
    with pytest.raises(ReplayMismatchError) as info:
        replay_checkpoint(node.store, cid)
    assert info.value.layer == MOMENTUM_PREFIX + name

    # A nesterov run's checkpoint after round 1 without its momentum is refused by a joiner.
    sgd = TrainingConfig.from_dict({**NESTEROV.to_dict(), "outer_optimizer": "sgd",
                                    "outer_momentum": 0.0, "outer_lr": 1.0})  # fmt: skip
    writer = _node(tmp_path, "w", sgd)
    play_full_round([writer], 1)
    plain = writer.store_checkpoint()
    joiner = _node(tmp_path, "j")
    copy_closure(writer.store, joiner.store, plain)
    with pytest.raises(CatchUpError, match="stores no outer momentum"):
        joiner.adopt_checkpoint(plain)
    assert zero_momentum(writer.state).keys() == writer.state.keys()
