"""What a model needs in memory per phase, against what this machine has (issue 27).

The parameter limit follows the machine: ``cnode train`` computes, from the run config's model
fields alone (nothing allocated yet), the peak of each phase of a round and refuses to start
with those figures when the largest does not fit in the memory available now. The fixed
``MAX_MODEL_PARAMETERS_CEILING`` (checked when the config is read) bounds what a run config can
ask for at all. See specs/training.md#memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from .. import limits
from .._config import TrainingConfig
from .._exceptions import TrainingConfigError

__all__ = ["MemoryNeed", "check_model_fits", "memory_need"]

_FLOAT32_BYTES = 4


@dataclass(frozen=True)
class MemoryNeed:
    """Peak bytes of a node's phases for one model (whole-model buffers + the node's base)."""

    parameters: int
    training_bytes: int
    round_bytes: int
    buffers_extra: int = 0  # run state beyond the state itself: the outer momentum, if any
    # AdamW's two moments held between rounds (inner_optimizer_state = "keep"): counted in
    # training's buffers already, they add to the round's other phases only.
    round_extra: int = 0

    @property
    def peak_bytes(self) -> int:
        return max(self.training_bytes, self.round_bytes)

    def describe(self) -> str:
        return (
            f"~{self.parameters / 1e6:,.0f}M parameters need "
            f"{_gb(self.training_bytes)} to train "
            f"({limits.TRAINING_BUFFERS + self.buffers_extra} whole-model "
            f"buffers) and {_gb(self.round_bytes)} for the round's other phases "
            f"({limits.ROUND_BUFFERS + self.buffers_extra + self.round_extra} buffers), "
            "each plus "
            f"{_gb(limits.NODE_BASE_BYTES)} "
            "for the node"
        )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def memory_need(
    parameters: int, *, momentum: bool = False, inner_moments: bool = False
) -> MemoryNeed:
    """The peaks :func:`check_model_fits` compares with the machine's available memory; an
    outer momentum (``nesterov``) is one more whole-model buffer in every phase, and AdamW's
    moments kept between rounds (``inner_moments``) two more in the round's other phases."""
    model = parameters * _FLOAT32_BYTES
    extra = 1 if momentum else 0
    kept = limits.INNER_MOMENT_BUFFERS if inner_moments else 0
    return MemoryNeed(
        parameters=parameters,
        training_bytes=(limits.TRAINING_BUFFERS + extra) * model + limits.NODE_BASE_BYTES,
        round_bytes=(limits.ROUND_BUFFERS + extra + kept) * model + limits.NODE_BASE_BYTES,
        buffers_extra=extra,
        round_extra=kept,
    )


def check_model_fits(config: TrainingConfig, available: int | None = None) -> MemoryNeed:
    """Raise :class:`TrainingConfigError` naming the figures when ``config``'s model does not
    fit in ``available`` bytes (default: what psutil says this machine has available now).

    A pretrained (Hub) model's size is known only once it is downloaded: this check does not
    cover it (the ceiling does not either; specs/training.md#memory says so).
    """
    parameters = 0 if config.model.pretrained else config.model.approx_parameters()
    need = memory_need(
        parameters,
        momentum=config.outer_optimizer == "nesterov",
        inner_moments=config.inner_optimizer_state == "keep",
    )
    have = psutil.virtual_memory().available if available is None else available
    if need.peak_bytes > have:
        raise TrainingConfigError(
            f"training.model does not fit this machine: {need.describe()}; "
            f"{_gb(have)} is available (a bigger machine, or a smaller model)"
        )
    return need
