"""Value types of cnode.aggregation: specs, configuration, per-peer records and the result."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import limits
from ._exceptions import AggregatorConfigError

__all__ = [
    "AGGREGATORS",
    "FLOAT_DTYPES",
    "AggregationResult",
    "AggregatorConfig",
    "PeerRecord",
    "TensorSpec",
]

# dtypes an update tensor may have; the working precision is always float64.
FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

# Rule name -> parameter names it accepts (with their types).
AGGREGATORS: Mapping[str, Mapping[str, tuple[type, ...]]] = {
    "mean": {},
    "weighted_mean": {},
    "median": {},
    "trimmed_mean": {"f": (int,)},
    "krum": {"f": (int,)},
    "centered_clip": {
        "tau": (int, float, type(None)),
        "tau_scale": (int, float),
        "start": (str,),
        "max_iterations": (int,),
        "tolerance": (int, float),
        "reject_score": (int, float),
        "normalize": (str,),
    },
}

_CLIP_STARTS = ("median", "previous")


@dataclass(frozen=True)
class TensorSpec:
    """What one named tensor of an update must look like."""

    shape: tuple[int, ...]  # exact shape
    dtype: torch.dtype  # exact dtype; one of FLOAT_DTYPES

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        """The spec a tensor satisfies (convenience for callers that hold a model)."""
        return cls(tuple(tensor.shape), tensor.dtype)


@dataclass(frozen=True)
class AggregatorConfig:
    """Which rule aggregates a round and with which parameters.

    ``params`` holds only what the caller set; defaults come from :mod:`limits`. The config is
    recorded (``to_dict``) next to the aggregate so anyone can recompute it.
    """

    name: str = "centered_clip"
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in AGGREGATORS:
            known = ", ".join(sorted(AGGREGATORS))
            raise AggregatorConfigError(f"unknown aggregator {self.name!r} (known: {known})")
        allowed = AGGREGATORS[self.name]
        for key, value in self.params.items():
            if key not in allowed:
                raise AggregatorConfigError(
                    f"aggregator {self.name!r} takes no parameter {key!r} "
                    f"(takes: {', '.join(sorted(allowed)) or 'none'})"
                )
            if isinstance(value, bool) or not isinstance(value, allowed[key]):
                raise AggregatorConfigError(
                    f"parameter {key!r} of {self.name!r} has the wrong type {type(value).__name__}"
                )
        _check_ranges(self.name, self.params)
        object.__setattr__(self, "params", dict(sorted(self.params.items())))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AggregatorConfig:
        if not isinstance(data, Mapping) or set(data) - {"name", "params"}:
            raise AggregatorConfigError("aggregator config must be {'name': str, 'params': dict}")
        name = data.get("name", "centered_clip")
        params = data.get("params", {})
        if not isinstance(name, str) or not isinstance(params, Mapping):
            raise AggregatorConfigError("aggregator config must be {'name': str, 'params': dict}")
        return cls(name=name, params=dict(params))


def _check_ranges(name: str, params: Mapping[str, Any]) -> None:
    def bad(key: str, why: str) -> AggregatorConfigError:
        return AggregatorConfigError(f"parameter {key!r} of {name!r} {why}")

    if "f" in params and params["f"] < 0:
        raise bad("f", "must be >= 0")
    tau = params.get("tau")
    if tau is not None and not (math.isfinite(tau) and tau > 0):
        raise bad("tau", "must be a finite number > 0 (or None for the scale-free rule)")
    scale = params.get("tau_scale", 1.0)
    if not (math.isfinite(scale) and scale > 0):
        raise bad("tau_scale", "must be a finite number > 0")
    if params.get("normalize", "clipped") not in ("clipped", "all"):
        raise bad("normalize", "must be 'clipped' or 'all'")
    if params.get("start", "median") not in _CLIP_STARTS:
        raise bad("start", f"must be one of {', '.join(_CLIP_STARTS)}")
    iters = params.get("max_iterations", 1)
    if not 1 <= iters <= 10 * limits.CLIP_MAX_ITERATIONS:
        raise bad("max_iterations", f"must be in 1..{10 * limits.CLIP_MAX_ITERATIONS}")
    rej = params.get("reject_score", 0.0)
    if not (math.isfinite(rej) and (rej == 0 or rej >= 1)):
        raise bad("reject_score", "must be 0 (off) or a finite number >= 1")
    tol = params.get("tolerance", 0.0)
    if not (math.isfinite(tol) and tol >= 0):
        raise bad("tolerance", "must be a finite number >= 0")


@dataclass(frozen=True)
class PeerRecord:
    """What one round's aggregation saw of one peer: the raw material of ban evidence."""

    peer: str  # the peer id the update was keyed by
    distance: float | None  # L2 distance of its update to the aggregate (float64); None if rejected
    clip_weight: float | None  # CenteredClip: min(1, tau/distance) at the end; Krum: 1 chosen/0
    # not; mean rules: 1.0; median and trimmed mean: None (no per-peer weight exists)
    rejected: str | None  # why the update was left out before the math, None if accepted
    weight: float = 1.0  # the weight it was given (samples processed), 1.0 when unweighted
    score: float | None = None  # distance / median distance of accepted peers (scale-free)
    outlier: bool = False  # score > limits.OUTLIER_SCORE

    def to_dict(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "distance": self.distance,
            "clip_weight": self.clip_weight,
            "rejected": self.rejected,
            "weight": self.weight,
            "score": self.score,
            "outlier": self.outlier,
        }


@dataclass(frozen=True)
class AggregationResult:
    """The aggregate, what happened to each peer, and the parameters actually used."""

    tensors: dict[str, torch.Tensor]  # name -> aggregate, with the expected shape and dtype
    records: dict[str, PeerRecord]  # peer id -> record, for every peer passed in (sorted)
    params: dict[str, Any]  # rule name and the parameters used (e.g. the derived tau,
    # iterations, accepted count); JSON/CBOR-friendly, stored with the checkpoint

    @property
    def accepted(self) -> list[str]:
        return [p for p, r in self.records.items() if r.rejected is None]

    @property
    def rejected(self) -> dict[str, str]:
        return {p: r.rejected for p, r in self.records.items() if r.rejected is not None}
