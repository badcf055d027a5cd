"""An attack built for sparse updates: the whole budget in a few coordinates, at large values.

A sparse codec sends about 1/64 of the values; CenteredClip and the scores bound an update by
its L2 distance. ``sparse_spike`` keeps its L2 norm to that of the attacker's own honest update
(so a norm test sees nothing odd) and puts all of it into ``SPIKE_FRACTION`` of the coordinates,
those where the honest mean is largest, against the mean: each such coordinate moves by
``norm / sqrt(m)``, hundreds of times an honest value, and the few values fit a sparse chunk's
quota, so the codec passes them whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from . import limits

__all__ = ["sparse_spike"]


def sparse_spike(
    honest: Sequence[Mapping[str, torch.Tensor]],
    own: Mapping[str, torch.Tensor],
    rng: torch.Generator,
    n: int,
    f: int,
) -> dict[str, torch.Tensor]:
    """The attacker's L2 budget in the top ``SPIKE_FRACTION`` coordinates of the honest mean."""
    names = sorted(own)
    pool = list(honest) or [own]
    mean = torch.cat(
        [torch.stack([u[k].double().reshape(-1) for u in pool]).mean(0) for k in names]
    )
    budget = math.sqrt(sum(float(own[k].double().square().sum()) for k in names))
    m = max(1, math.ceil(mean.numel() * limits.SPIKE_FRACTION))
    top = mean.abs().topk(m).indices
    flat = torch.zeros_like(mean)
    flat[top] = -torch.sign(mean[top]) * (budget / math.sqrt(m))
    out, at = {}, 0
    for k in names:
        size = own[k].numel()
        out[k] = flat[at : at + size].reshape(own[k].shape).to(own[k].dtype)
        at += size
    return out
