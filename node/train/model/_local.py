"""Local training: K optimizer steps from the round's state, and the update they give.

The update is the **parameter delta** ``trained - start`` (float32), not a momentum. Every round
starts from the agreed state. The local AdamW's moments either start fresh every round
(``training.inner_optimizer_state = "fresh"``: an update depends only on (state, peer's shard,
round, seed)) or are the node's own, carried from its previous round (``"keep"``, as DiLoCo's
workers do: :class:`InnerMoments`; the update then also depends on them). Nobody else re-runs a
peer's local steps, so the moments are never checked by others (specs/training.md#inner-optimizer).

The steps run on the node's device in its precision (``Placement``); the start state comes from
the CPU and the update goes back to it as float32, where everything other nodes check is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .. import limits
from .._config import TrainingConfig
from ._data import TextData
from ._device import Placement, autocast
from ._model import State, load_state, model_state

_CPU = Placement(torch.device("cpu"))
_ADAMW_KEYS = {"step", "exp_avg", "exp_avg_sq"}  # torch.optim.AdamW's state per parameter

__all__ = ["InnerMoments", "LocalResult", "evaluate", "train_local"]


class InnerMoments:
    """A node's local AdamW state (``exp_avg``, ``exp_avg_sq``, ``step`` per parameter name),
    kept from one round's local steps to the next (``inner_optimizer_state = "keep"``).

    Empty at first (and after :meth:`clear`): the next round starts a fresh AdamW and fills it.
    The tensors live on the device the local steps ran on, in float32 whatever the precision.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, dict[str, torch.Tensor]] = {}

    def __bool__(self) -> bool:
        return bool(self.tensors)

    def clear(self) -> None:
        self.tensors = {}


@dataclass(frozen=True)
class LocalResult:
    """What one peer's local steps produced."""

    delta: State  # trained - start, per parameter (float32)
    samples: int  # sequences trained on
    loss_first: float  # training loss of the first step
    loss_last: float  # training loss of the last step
    seconds: float


def train_local(
    model: torch.nn.Module,
    start: State,
    data: TextData,
    config: TrainingConfig,
    *,
    peer_id: str,
    round_: int,
    placement: Placement = _CPU,
    moments: InnerMoments | None = None,
) -> LocalResult:
    """Run ``config.local_steps`` AdamW steps from ``start`` on ``peer_id``'s shard, on
    ``placement``'s device (where ``model`` must already be) in its precision.

    With ``moments``, AdamW starts from the moments they hold (none: fresh) and they hold the
    moments after the last step on return; without, AdamW starts fresh and its state is dropped.
    """
    began = time.perf_counter()
    load_state(model, start)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    params = dict(model.named_parameters())
    if moments:
        _restore(optimizer, params, moments)
    batches = data.batches(
        peer_id, round_, seed=config.seed, steps=config.local_steps, batch_size=config.batch_size
    )
    device = placement.device
    losses: list[torch.Tensor] = []
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with autocast(placement):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()  # outside autocast, as torch recommends; the gradients are float32
        optimizer.step()
        losses.append(loss.detach())  # read once at the end: no device sync per step
    if moments is not None:
        # The optimizer's own tensors, not copies: the next round's AdamW takes them over.
        moments.tensors = {name: dict(optimizer.state[p]) for name, p in params.items()}
    trained = model_state(model)
    delta = {name: trained[name] - start[name] for name in start}
    return LocalResult(
        delta=delta,
        samples=sum(int(b.shape[0]) for b in batches),
        loss_first=float(losses[0]),
        loss_last=float(losses[-1]),
        seconds=time.perf_counter() - began,
    )


def _restore(
    optimizer: torch.optim.Optimizer,
    params: dict[str, torch.nn.Parameter],
    moments: InnerMoments,
) -> None:
    """Hand ``moments`` to a new AdamW over ``params``; moments that do not fit are dropped
    (the steps start fresh) rather than trusted."""
    kept = moments.tensors
    fits = set(kept) == set(params) and all(
        set(kept[n]) == _ADAMW_KEYS
        and kept[n]["exp_avg"].shape == kept[n]["exp_avg_sq"].shape == p.shape
        and kept[n]["exp_avg"].device == kept[n]["exp_avg_sq"].device == p.device
        for n, p in params.items()
    )
    if not fits:
        moments.clear()
        return
    for name, p in params.items():
        optimizer.state[p] = kept[name]


def evaluate(model: torch.nn.Module, state: State, data: TextData) -> float:
    """Mean loss of ``state`` on the held-out sequences (the same on every node), over
    EVAL_BATCH_SEQUENCES sequences a pass. Every sequence has the same length, so the mean over
    all predicted tokens is the passes' means weighted by their sequences."""
    load_state(model, state)
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    with torch.no_grad():
        for rows in data.eval.split(limits.EVAL_BATCH_SEQUENCES):
            batch = rows.to(device)
            total += float(model(input_ids=batch, labels=batch).loss) * len(rows)
    model.train()
    return total / len(data.eval)
