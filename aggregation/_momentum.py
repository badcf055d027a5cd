"""Worker momentum: each peer sends its momentum, not its raw update.

Karimireddy, He & Jaggi (2021) show robust aggregation of *momentum* vectors is what makes
CenteredClip provably robust: averaging over time shrinks the honest peers' spread, so the room an
attacker has inside the honest cloud (ALIE, IPM) shrinks with it. The peer keeps ``m`` locally and
publishes ``m`` as its update; the aggregate of the momenta is what the node applies.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ._exceptions import AggregationInputError

__all__ = ["worker_momentum"]


def worker_momentum(
    momentum: Mapping[str, torch.Tensor] | None, update: Mapping[str, torch.Tensor], beta: float
) -> dict[str, torch.Tensor]:
    """Return ``beta * momentum + (1 - beta) * update`` per tensor (``update`` when None).

    The (1 - beta) factor keeps the momentum on the scale of one update, so the learning rate
    that applies the aggregate needs no change when momentum is switched on.
    """
    if not 0.0 <= beta < 1.0:
        raise AggregationInputError("momentum beta must be in [0, 1)")
    if momentum is None:
        return {k: t.detach().clone() for k, t in update.items()}
    if set(momentum) != set(update):
        raise AggregationInputError("momentum and update have different tensor names")
    return {k: momentum[k] * beta + update[k].detach() * (1.0 - beta) for k in sorted(update)}
