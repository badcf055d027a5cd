"""Local training: K optimizer steps from the round's state, and the update they give.

The update is the **parameter delta** ``trained - start`` (float32), not a momentum. The local
AdamW state is created fresh every round, so an update depends only on (state, peer's shard,
round, seed): a node that crashed or joined late needs nothing but the agreed state to train.

The steps run on the node's device in its precision (``Placement``); the start state comes from
the CPU and the update goes back to it as float32, where everything other nodes check is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .._config import TrainingConfig
from ._data import TextData
from ._device import Placement, autocast
from ._model import State, load_state, model_state

_CPU = Placement(torch.device("cpu"))

__all__ = ["LocalResult", "evaluate", "train_local"]


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
) -> LocalResult:
    """Run ``config.local_steps`` AdamW steps from ``start`` on ``peer_id``'s shard, on
    ``placement``'s device (where ``model`` must already be) in its precision."""
    began = time.perf_counter()
    load_state(model, start)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
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
    trained = model_state(model)
    delta = {name: trained[name] - start[name] for name in start}
    return LocalResult(
        delta=delta,
        samples=sum(int(b.shape[0]) for b in batches),
        loss_first=float(losses[0]),
        loss_last=float(losses[-1]),
        seconds=time.perf_counter() - began,
    )


def evaluate(model: torch.nn.Module, state: State, data: TextData) -> float:
    """Mean loss of ``state`` on the held-out sequences (the same on every node)."""
    load_state(model, state)
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        batch = data.eval.to(device)
        loss = float(model(input_ids=batch, labels=batch).loss)
    model.train()
    return loss
