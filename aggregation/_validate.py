"""Input checks that run before any arithmetic: a bad update never reaches the math."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from . import limits
from ._exceptions import AggregationInputError
from ._types import FLOAT_DTYPES, TensorSpec

__all__ = ["check_expected", "check_peer_id", "check_weights", "validate_update"]


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[: limits.MAX_NAMES_IN_REASON])
    more = len(names) - limits.MAX_NAMES_IN_REASON
    return shown + (f" and {more} more" if more > 0 else "")


def validate_update(update: Any, expected: Mapping[str, TensorSpec]) -> str | None:
    """Return why ``update`` may not be aggregated, or None when it is acceptable.

    Checks, in order: it is a mapping of str to dense CPU tensors; exactly the expected names;
    each tensor's shape and dtype; every value finite. The first failure is the reason.
    """
    if not isinstance(update, Mapping):
        return f"update is a {type(update).__name__}, not a mapping of name to tensor"
    keys = list(update.keys())
    if not all(isinstance(k, str) for k in keys):
        return "update has a tensor name that is not a string"
    missing = sorted(set(expected) - set(keys))
    if missing:
        return f"missing tensors: {_names(missing)}"
    extra = sorted(set(keys) - set(expected))
    if extra:
        return f"unexpected tensors: {_names(extra)}"
    for name in sorted(expected):
        spec = expected[name]
        tensor = update[name]
        if not isinstance(tensor, torch.Tensor):
            return f"{name!r} is a {type(tensor).__name__}, not a tensor"
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.device.type != "cpu":
            return f"{name!r} is not a dense CPU tensor"
        if tuple(tensor.shape) != spec.shape:
            return f"{name!r} has shape {tuple(tensor.shape)}, expected {spec.shape}"
        if tensor.dtype != spec.dtype:
            return f"{name!r} has dtype {tensor.dtype}, expected {spec.dtype}"
    for name in sorted(expected):
        tensor = update[name]
        # aminmax: one pass, no temporary; NaN propagates to both ends, +-Inf shows at an end.
        if tensor.numel() and not all(math.isfinite(float(e)) for e in torch.aminmax(tensor)):
            nan = int(torch.isnan(tensor).sum())
            inf = int(torch.isinf(tensor).sum())
            return f"{name!r} is not finite ({nan} NaN, {inf} Inf)"
    return None


def check_expected(expected: Any) -> dict[str, TensorSpec]:
    """The caller's spec, checked and sorted by name."""
    if not isinstance(expected, Mapping) or not expected:
        raise AggregationInputError("expected must be a non-empty mapping of name to TensorSpec")
    out: dict[str, TensorSpec] = {}
    for name in sorted(expected):
        spec = expected[name]
        if not isinstance(name, str) or not isinstance(spec, TensorSpec):
            raise AggregationInputError(f"expected[{name!r}] must be a TensorSpec keyed by str")
        if spec.dtype not in FLOAT_DTYPES:
            raise AggregationInputError(f"expected[{name!r}] has non-float dtype {spec.dtype}")
        if any((not isinstance(d, int)) or d < 0 for d in spec.shape):
            raise AggregationInputError(f"expected[{name!r}] has a bad shape {spec.shape}")
        out[name] = spec
    return out


def check_peer_id(peer: Any) -> str | None:
    """Why a key cannot be a peer id, or None."""
    if not isinstance(peer, str) or not peer:
        return "peer id is not a non-empty string"
    if len(peer) > limits.MAX_PEER_ID_LENGTH or not peer.isprintable():
        return "peer id is too long or not printable"
    return None


def check_weights(weights: Any, peers: list[str]) -> dict[str, float]:
    """Weights for ``peers`` (every peer needs one, finite and > 0)."""
    if not isinstance(weights, Mapping):
        raise AggregationInputError("weights must be a mapping of peer id to float")
    out: dict[str, float] = {}
    for peer in peers:
        if peer not in weights:
            raise AggregationInputError(f"no weight given for peer {peer}")
        w = weights[peer]
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise AggregationInputError(f"weight of peer {peer} must be a finite number > 0")
        out[peer] = float(w)
    return out
