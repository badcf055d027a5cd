"""Error feedback: the quantization residual a node keeps between its rounds.

A lossy codec (``bf16``, ``int8-blockwise``) sends ``decoded = decode(encode(delta))`` instead of
``delta``. The node keeps ``residual = delta - decoded`` and adds it to its next round's delta, so
what compression leaves out is sent later instead of lost (error feedback, as in 1-bit SGD and
the EF-SGD line of work; "Training Transformers Together" ran 8-bit updates the same way).

The residual is local state, never sent: it is stored in the node's own block store as a
``kind="update"`` manifest (float32 tensors, ``extra.residual_of`` = the round it came from)
pinned as ``train-<run>-residual``, so a restarted node resumes with it; a node that re-syncs from
a checkpoint drops it. See specs/training.md#error-feedback.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
import torch

from cnode.storage import BlockStore, CheckpointMeta, StorageError, load_checkpoint, save_checkpoint

from ._model import State

__all__ = ["Residual", "drop_residual", "load_residual", "save_residual", "with_residual"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Residual:
    """What compression left out of this node's update of ``round``; added to round + 1."""

    round: int
    tensors: State


def with_residual(delta: State, residual: Residual, decay: float) -> State:
    """What a lossy codec encodes: ``delta + decay x residual`` per tensor (``training.
    error_decay``). Elementwise float32, so the same bits on any machine and thread count; decay 1
    adds the residual as it is (no multiply), as before the key existed."""
    if decay == 1.0:
        return {k: t + residual.tensors[k] for k, t in delta.items()}
    # Two exactly rounded float32 operations, never a fused multiply-add (whose use could vary
    # with the CPU's vector width): the same bits everywhere.
    scale = torch.tensor(decay, dtype=torch.float32)
    return {k: t + residual.tensors[k] * scale for k, t in delta.items()}


def residual_pin(run: str) -> str:
    return f"train-{run}-residual"


def save_residual(store: BlockStore, run: str, residual: Residual) -> None:
    """Store ``residual`` and pin it (replacing the previous one)."""
    meta = CheckpointMeta(
        run_id=run,
        kind="update",
        round=residual.round,
        extra={"residual_of": residual.round},
    )
    store.pin(residual_pin(run), save_checkpoint(store, residual.tensors, meta))


def load_residual(store: BlockStore, run: str) -> Residual | None:
    """The pinned residual, or None (none kept, or unreadable: then it is dropped)."""
    cid = store.pins().get(residual_pin(run))
    if cid is None:
        return None
    try:
        tensors, manifest = load_checkpoint(store, cid)
    except StorageError as exc:
        log.warning("residual_unreadable", manifest=str(cid), error=str(exc))
        drop_residual(store, run)
        return None
    of = (manifest.extra or {}).get("residual_of")
    if manifest.kind != "update" or not isinstance(of, int) or isinstance(of, bool):
        log.warning("residual_unreadable", manifest=str(cid), error="not a residual manifest")
        drop_residual(store, run)
        return None
    return Residual(of, tensors)


def drop_residual(store: BlockStore, run: str) -> None:
    """Forget the pinned residual (its blocks go with the next ``gc``)."""
    store.unpin(residual_pin(run))
