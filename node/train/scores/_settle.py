"""Where score losses are computed, and how device differences stay out of the integer scores.

Scores are recomputed by other nodes (every member in a full round, the assigned scorers and
the disputes' recomputation in a partitioned round, ``verify --replay``), on whatever hardware
they have. So a score's losses are computed in two arithmetics:

* **fast**: float32 on the node's device (``Placement.device``; the CPU for replay and for a
  node without a GPU), in eval mode, no autocast. Not bf16 even in a ``bf16-mixed`` run: bf16
  moves a loss by ~1e-5 relative (bench/score_precision.py), a fifth of a SCORE_UNIT of score,
  so nearly every score would need the reference;
* **reference**: float64 on the CPU, as every score was computed before issue 26.

An integer score is ``round(x)`` of a real ``x = (before - after) / before / SCORE_UNIT``. Honest
fast losses are within SCORE_DEVICE_RTOL (relative) of the reference, so their ``x`` is within
``BOUNDARY_UNITS = 2 x SCORE_DEVICE_RTOL / SCORE_UNIT`` of the reference's. **The rule**: a node
takes the fast losses of a target unless one of its two ``x`` (own, held) lies within
BOUNDARY_UNITS of a rounding boundary (a half-integer), or a fast loss is not finite; then it
computes the target's four losses in the reference arithmetic and takes those. Both ways give
the reference's integers: a fast ``x`` farther than BOUNDARY_UNITS from every boundary rounds as
the reference ``x`` does. So honest nodes agree on every integer (and every decision built on
them: admission, reputation, bans) whatever their devices, replay on any machine reproduces
them, and two honest scorers of a partitioned round never dispute. The recorded losses are the
ones taken (fast or reference): a replay compares them within SCORE_LOSS_RTOL (twice
SCORE_DEVICE_RTOL: two devices, each within SCORE_DEVICE_RTOL of the reference) and the
integers exactly. A scorer whose integers differ from the recomputation is still wrong beyond
any honest device difference (the dispute rule of _spread.py).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence

import torch

from cnode.aggregation import limits as agg_limits

from .. import limits
from .._config import TrainingConfig
from .._exceptions import TrainingConfigError
from ..model import Placement, build_model, load_state

__all__ = ["BOUNDARY_UNITS", "LossModels", "near_boundary", "settle_needed"]

Losses = tuple[float, float, float, float]  # own_before, own_after, held_before, held_after

# How close (in score units) to a rounding boundary a fast score must be for the reference to
# settle it: twice the loss error any honest device may make, in units (module docstring).
BOUNDARY_UNITS = 2 * limits.SCORE_DEVICE_RTOL / agg_limits.SCORE_UNIT


def near_boundary(before: float, after: float) -> bool:
    """Whether ``loss_score(before, after)`` could round otherwise in the reference arithmetic
    (or the fast losses cannot be scored at all: not finite, or ``before <= 0``)."""
    # loss_score's other edges (SCORE_LOSS_FLOOR, MAX_SCORE_LOSS, non-finite) are boundaries
    # too: a loss within a factor 2 of one is left to the reference (cross-entropies are ~0.1-10).
    lo, hi = 2 * agg_limits.SCORE_LOSS_FLOOR, agg_limits.MAX_SCORE_LOSS / 2
    if not (lo < before < hi and lo < after < hi):
        return True
    x = (before - after) / before / agg_limits.SCORE_UNIT
    return abs(x - math.floor(x) - 0.5) < BOUNDARY_UNITS


def settle_needed(losses: Losses) -> bool:
    """Whether a target's fast losses must be replaced by the reference's (the rule above)."""
    own_before, own_after, held_before, held_after = losses
    return near_boundary(own_before, own_after) or near_boundary(held_before, held_after)


class LossModels:
    """The run's model in the two arithmetics, built on first use and kept for the next rounds.

    The fast model's weights are made on its device: the agreed state is copied there once and
    kept while its tensors are unchanged (the same objects, no in-place write since: torch's
    version counters), so a round's targets share one copy and only each update travels."""

    def __init__(
        self,
        config: TrainingConfig,
        placement: Placement | None = None,
        stage_transfers: bool | None = None,
    ) -> None:
        self.config = config
        self.device = placement.device if placement is not None else torch.device("cpu")
        # A CUDA device takes each state and update in one copy from page-locked memory, instead
        # of a synchronous copy per layer from pageable memory: 2-4x faster on an H200
        # (bench/gpu_check.py measures both).
        self.stage_transfers = (
            self.device.type == "cuda" if stage_transfers is None else stage_transfers
        )
        self._staging: torch.Tensor | None = None  # page-locked, one state's float32 values
        self._landing: torch.Tensor | None = None  # the same on the device
        self._fast: torch.nn.Module | None = None
        self._params: list[tuple[str, torch.Tensor]] = []  # the fast model's, in state order
        self._parent: list[torch.Tensor] = []  # the agreed state on the device, float32
        self._parent_of: list[tuple[weakref.ref[torch.Tensor], int]] = []  # whose copy it is
        self._reference: torch.nn.Module | None = None
        self.settled = 0  # targets the reference settled (for the log and the bench)

    def fast(
        self,
        state: Mapping[str, torch.Tensor],
        update: Mapping[str, torch.Tensor] | None,
        batches: Sequence[torch.Tensor],
    ) -> list[float]:
        """Losses of ``state`` (+ SCORE_STEP x ``update``) on ``batches``: float32, the device.
        An empty ``batches`` gives [] without a forward pass."""
        if not batches:
            return []
        if self._fast is None:
            self._fast = build_model(self.config).float().eval()
            torch.nn.Module.to(self._fast, self.device)
            self._params = list(self._fast.named_parameters())
        self._load_fast(state, update)
        return _batched_losses(self._fast, batches, self.device)

    def _load_fast(
        self, state: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor] | None
    ) -> None:
        names = [n for n, _ in self._params]
        if set(names) != set(state):
            load_state(self._fast_model(), dict(state))  # raises, naming what does not fit
        parent = self._parent_on_device(state, names)
        params = [p for _, p in self._params]
        with torch.no_grad():
            if update is None:
                torch._foreach_copy_(params, parent)
                return
            # The CPU arithmetic of before (SCORE_STEP is a power of two: the scaling is exact,
            # the add rounds once), on the device: only the update crosses.
            # Layer by layer: a large round's update decodes each layer when it is looked up.
            if self.stage_transfers:
                torch._foreach_copy_(params, self._staged(update))
            else:
                for p, name in zip(params, names, strict=True):
                    layer = update[name]
                    if tuple(p.shape) != tuple(layer.shape):
                        raise TrainingConfigError(f"update layer {name} has shape {layer.shape}")
                    p.copy_(layer)
            torch._foreach_mul_(params, agg_limits.SCORE_STEP)
            torch._foreach_add_(params, parent)

    def _staged(
        self, source: Mapping[str, torch.Tensor], what: str = "update"
    ) -> list[torch.Tensor]:
        """``source``'s layers (a state's or an update's), in the fast model's order, on the
        device as views of one buffer: gathered layer by layer into one page-locked host buffer
        (kept for the next), then sent in one transfer."""
        total = sum(p.numel() for _, p in self._params)
        cuda = self.device.type == "cuda"
        if self._staging is None or self._staging.numel() != total:
            self._staging = torch.empty(total, dtype=torch.float32, pin_memory=cuda)
            self._landing = torch.empty(total, dtype=torch.float32, device=self.device)
        assert self._landing is not None
        if cuda:  # the host buffer is rewritten only once the last transfer from it is done
            torch.cuda.current_stream(self.device).synchronize()
        views, at = [], 0
        for name, param in self._params:
            layer, shape = source[name], param.shape
            if tuple(layer.shape) != tuple(shape):
                raise TrainingConfigError(f"{what} layer {name} has shape {tuple(layer.shape)}")
            self._staging[at : at + shape.numel()].copy_(layer.reshape(-1))
            views.append(self._landing[at : at + shape.numel()].view(shape))
            at += shape.numel()
        self._landing.copy_(self._staging, non_blocking=True)
        return views

    def _fast_model(self) -> torch.nn.Module:
        assert self._fast is not None
        return self._fast

    def _parent_on_device(
        self, state: Mapping[str, torch.Tensor], names: list[str]
    ) -> list[torch.Tensor]:
        tensors = [state[n] for n in names]
        same = len(self._parent_of) == len(tensors) and all(
            ref() is t and t._version == version
            for (ref, version), t in zip(self._parent_of, tensors, strict=True)
        )
        if not same:
            for (name, p), t in zip(self._params, tensors, strict=True):
                if tuple(p.shape) != tuple(t.shape):
                    raise TrainingConfigError(f"state layer {name} has shape {tuple(t.shape)}")
            if self.device.type == "cpu" and all(t.dtype == torch.float32 for t in tensors):
                self._parent = tensors  # already where and what the model needs
            elif self.stage_transfers:  # its own copy: the staging buffer takes the updates
                self._parent = [t.clone() for t in self._staged(state, "state")]
            else:
                self._parent = [t.to(self.device, torch.float32, copy=True) for t in tensors]
            self._parent_of = [(weakref.ref(t), t._version) for t in tensors]
        return self._parent

    def reference(
        self,
        state: Mapping[str, torch.Tensor],
        update: Mapping[str, torch.Tensor] | None,
        batches: Sequence[torch.Tensor],
    ) -> list[float]:
        """The same losses in float64 on the CPU: what settles a score near a boundary."""
        if self._reference is None:
            self._reference = build_model(self.config).double().eval()
        load_state(self._reference, _weights(state, update, torch.float64))
        with torch.inference_mode():  # one batch per forward pass, the model's own loss
            return [float(self._reference(input_ids=b, labels=b).loss) for b in batches]


def _weights(
    state: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor] | None, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    # Made on the CPU in ``dtype`` (SCORE_STEP is a power of two: the scaling is exact, the add
    # rounds once).
    weights = {k: t.to(dtype) for k, t in state.items()}
    if update is not None:
        weights = {k: w + agg_limits.SCORE_STEP * update[k].to(dtype) for k, w in weights.items()}
    return weights


def _batched_losses(
    model: torch.nn.Module, batches: Sequence[torch.Tensor], device: torch.device
) -> list[float]:
    """Each batch's mean next-token loss (the model's own ``loss``: cross-entropy of the logits
    of positions 0..T-2 against tokens 1..T-1, mean over the batch's tokens), with the batches
    run together in forward passes of up to SCORE_CHUNK_SEQUENCES sequences: on a GPU a
    forward pass of a few sequences costs about what one of many does."""
    rows = torch.cat(list(batches))
    sums = []
    with torch.inference_mode():
        for start in range(0, rows.shape[0], limits.SCORE_CHUNK_SEQUENCES):
            x = rows[start : start + limits.SCORE_CHUNK_SEQUENCES].to(device)
            logits = model(input_ids=x).logits[:, :-1].float()
            per_token = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none"
            )
            sums.append(per_token.view(x.shape[0], -1).sum(dim=1))
    per_row = torch.cat(sums).cpu()  # one sync
    out, at = [], 0
    for batch in batches:
        n = batch.shape[0]
        out.append(float(per_row[at : at + n].sum() / (n * (batch.shape[1] - 1))))
        at += n
    return out
