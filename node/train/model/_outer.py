"""The outer step: how a round's aggregate moves the state (specs/training.md#outer-optimizer).

``sgd``:       ``state ← state + outer_lr × aggregate``
``nesterov``:  ``m ← μ × m + aggregate``; ``state ← state + outer_lr × (aggregate + μ × m)``

The aggregate is a parameter delta (``trained - start``), the negative of DiLoCo's outer
gradient, so this is torch's ``SGD(nesterov=True)`` on ``-aggregate`` written with the signs
folded in. The momentum buffer ``m`` is run state: every node must compute it bit for bit, so it
is float32 on the CPU, one rounded torch op at a time in this fixed order (no fused multiply-add:
``alpha=`` arguments and ``addcmul`` may fuse, separate ``mul`` and ``add`` never do). It is
stored in each checkpoint (MOMENTUM_PREFIX layers), so a late joiner takes it over and replay
recomputes it. Where a round has no aggregate (nobody admitted, or a partition without output)
neither the state nor the momentum moves.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .._config import TrainingConfig
from .._exceptions import CatchUpError
from ._model import State

__all__ = [
    "MOMENTUM_PREFIX",
    "adopted_momentum",
    "join_momentum",
    "outer_step",
    "outer_step_flat",
    "split_momentum",
    "uses_momentum",
    "zero_momentum",
]

# Checkpoint layer names of the momentum buffer: MOMENTUM_PREFIX + the parameter's name. A torch
# parameter name is made of Python identifiers, which have no "-", so the two never collide.
MOMENTUM_PREFIX = "outer-momentum."


def uses_momentum(config: TrainingConfig) -> bool:
    """Whether the run's outer optimizer keeps a momentum buffer."""
    return config.outer_optimizer == "nesterov"


def zero_momentum(state: Mapping[str, torch.Tensor]) -> State:
    """The momentum of round 0: zeros shaped like the state, float32."""
    return {name: torch.zeros_like(t, dtype=torch.float32) for name, t in state.items()}


def _step(
    base: torch.Tensor,
    momentum: torch.Tensor | None,
    aggregate: torch.Tensor,
    config: TrainingConfig,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One tensor's outer step; returns (new values, new momentum); inputs are left intact."""
    delta = aggregate.to(torch.float32)
    if config.outer_optimizer == "nesterov":
        assert momentum is not None
        mu = config.outer_momentum
        new_m = torch.add(torch.mul(momentum, mu), delta)
        step = torch.add(delta, torch.mul(new_m, mu))
    else:
        new_m, step = None, delta
    if config.outer_lr != 1.0:
        step = torch.mul(step, config.outer_lr)
    return torch.add(base, step).contiguous(), new_m


def outer_step(
    parent: State,
    momentum: State | None,
    aggregate: Mapping[str, torch.Tensor],
    config: TrainingConfig,
) -> tuple[State, State | None]:
    """The new state and momentum from ``parent``, the momentum before the round and the
    round's aggregate (every layer of ``parent``). ``momentum`` is None for ``sgd``."""
    if uses_momentum(config) and momentum is None:
        momentum = zero_momentum(parent)
    new: State = {}
    new_m: State = {}
    for name, base in parent.items():
        m = momentum[name] if momentum is not None else None
        new[name], mt = _step(base, m, aggregate[name], config)
        if mt is not None:
            new_m[name] = mt
    return new, (new_m if uses_momentum(config) else None)


def outer_step_flat(
    flat: torch.Tensor,
    momentum: torch.Tensor | None,
    start: int,
    stop: int,
    values: torch.Tensor,
    config: TrainingConfig,
) -> None:
    """The outer step of ``flat[start:stop]`` (and ``momentum[start:stop]``), in place.

    The same elementwise ops as :func:`outer_step`, so a partitioned round gives the bytes a
    full-replication round gives.
    """
    m = momentum[start:stop] if momentum is not None else None
    new, new_m = _step(flat[start:stop], m, values, config)
    flat[start:stop].copy_(new)
    if momentum is not None and new_m is not None:
        momentum[start:stop].copy_(new_m)


def join_momentum(state: State, momentum: State | None) -> dict[str, torch.Tensor]:
    """What a checkpoint stores: the state's layers, plus the momentum's under MOMENTUM_PREFIX."""
    if momentum is None:
        return dict(state)
    return {**state, **{MOMENTUM_PREFIX + name: t for name, t in momentum.items()}}


def split_momentum(tensors: Mapping[str, torch.Tensor]) -> tuple[State, State | None]:
    """A checkpoint's tensors -> (state, momentum or None when it stores none)."""
    state = {n: t for n, t in tensors.items() if not n.startswith(MOMENTUM_PREFIX)}
    momentum = {
        n.removeprefix(MOMENTUM_PREFIX): t
        for n, t in tensors.items()
        if n.startswith(MOMENTUM_PREFIX)
    }
    return state, (momentum or None)


def adopted_momentum(
    config: TrainingConfig, state: State, momentum: State | None, cid: str, round_: int
) -> State | None:
    """The momentum a node takes over with checkpoint ``cid``'s ``state`` (split_momentum's
    output), checked against the run's outer optimizer; CatchUpError when it does not fit."""
    where = f"checkpoint {cid}"
    if not uses_momentum(config):
        if momentum is not None:
            raise CatchUpError(f"{where} stores an outer momentum; the run uses sgd")
        return None
    if momentum is None:
        if round_ > 0:
            raise CatchUpError(f"{where} of a nesterov run stores no outer momentum")
        return zero_momentum(state)  # stored before any round: the momentum starts at zeros
    fits = set(momentum) == set(state) and all(
        momentum[n].shape == t.shape and momentum[n].dtype == torch.float32
        for n, t in state.items()
    )
    if not fits:
        raise CatchUpError(f"{where}: its outer momentum does not fit the state")
    return momentum
