"""Attack harness: what a Byzantine peer sends, as a function of the honest updates.

Every attack has one signature (:class:`Attack`)::

    attack(honest, own, rng, n, f) -> update

``honest`` are the honest peers' updates of this round (an omniscient attacker; the strongest
assumption), ``own`` the update the attacker would have sent had it been honest, ``rng`` its
random source, ``n`` the number of peers and ``f`` the number of attackers. A node that has not
seen the others' updates may pass ``honest=[]``: the statistics then come from ``own`` alone, so
``alie`` degenerates to ``own`` (no spread to hide in) and ``ipm`` to ``-0.1 * own``.
Data-level attacks (:data:`ATTACKS_DATA_LEVEL`) poison the training data instead (see
:func:`flip_labels`); their update function returns ``own`` unchanged.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from . import limits
from ._sparse_attack import sparse_spike

__all__ = ["ATTACKS", "ATTACKS_DATA_LEVEL", "Attack", "flip_labels", "new_attack"]

Update = Mapping[str, torch.Tensor]


class Attack(Protocol):
    def __call__(
        self, honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
    ) -> dict[str, torch.Tensor]: ...


def _mean_std(
    honest: Sequence[Update], own: Update
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    pool = list(honest) or [own]
    mean, std = {}, {}
    for k in sorted(own):
        x = torch.stack([u[k].double() for u in pool])
        mean[k] = x.mean(0)
        std[k] = x.std(0, correction=0)
    return mean, std


def sign_flip(
    honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
) -> dict[str, torch.Tensor]:
    """Send the negated honest update."""
    return {k: -t for k, t in own.items()}


def gaussian(
    honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
) -> dict[str, torch.Tensor]:
    """Send large Gaussian noise: std = GAUSSIAN_STD_FACTOR x the RMS of the own update."""
    out = {}
    for k in sorted(own):
        t = own[k]
        rms = float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0
        noise = torch.randn(t.shape, generator=rng, dtype=torch.float64)
        out[k] = (noise * (limits.GAUSSIAN_STD_FACTOR * max(rms, 1e-12))).to(t.dtype)
    return out


def alie_z(n: int, f: int) -> float:
    """z of "A little is enough" (Baruch et al. 2019).

    s = floor(n/2 + 1) - f and z = Phi^-1((n - s) / n), capped at ALIE_MAX_Z.
    """
    s = math.floor(n / 2 + 1) - f
    p = (n - s) / n
    if p >= 1.0:
        return limits.ALIE_MAX_Z
    if p <= 0.0:
        return 0.0
    return min(statistics.NormalDist().inv_cdf(p), limits.ALIE_MAX_Z)


def alie(
    honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
) -> dict[str, torch.Tensor]:
    """Send mean - z * std of the honest updates, coordinate-wise: inside the honest spread."""
    mean, std = _mean_std(honest, own)
    z = alie_z(n, f)
    return {k: (mean[k] - std[k] * z).to(own[k].dtype) for k in sorted(own)}


def _ipm(honest: Sequence[Update], own: Update, epsilon: float) -> dict[str, torch.Tensor]:
    mean, _ = _mean_std(honest, own)
    return {k: (mean[k] * -epsilon).to(own[k].dtype) for k in sorted(own)}


def ipm(
    honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
) -> dict[str, torch.Tensor]:
    """Inner-product manipulation (Xie et al. 2020): send -0.1 x the honest mean."""
    return _ipm(honest, own, limits.IPM_EPSILON)


def ipm_large(
    honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
) -> dict[str, torch.Tensor]:
    """IPM with epsilon = IPM_LARGE_EPSILON: the variant aimed at the mean."""
    return _ipm(honest, own, limits.IPM_LARGE_EPSILON)


def label_flip(
    honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
) -> dict[str, torch.Tensor]:
    """Data-level: the poison is in ``own`` already (trained on flip_labels data); send it."""
    return {k: t.clone() for k, t in own.items()}


def nan(
    honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
) -> dict[str, torch.Tensor]:
    """Inject NaN and +Inf into the own update (validation must reject it)."""
    out = {k: t.clone() for k, t in own.items()}
    for k in sorted(out):
        flat = out[k].view(-1)
        if flat.numel():
            flat[0] = math.nan
            flat[-1] = math.inf
    return out


class StaleAttack:
    """Replays the own update of STALE_DELAY_ROUNDS calls ago (the oldest held until then).

    Stateful: one instance per attacker (see :func:`new_attack`).
    """

    def __init__(self, delay: int = limits.STALE_DELAY_ROUNDS) -> None:
        self._history: deque[dict[str, torch.Tensor]] = deque(maxlen=delay + 1)

    def __call__(
        self, honest: Sequence[Update], own: Update, rng: torch.Generator, n: int, f: int
    ) -> dict[str, torch.Tensor]:
        self._history.append({k: t.detach().clone() for k, t in own.items()})
        return {k: t.clone() for k, t in self._history[0].items()}


# label -> num_classes - 1 - label: every class is mapped to a wrong one when num_classes > 1
def flip_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The label-flipping attack's data transform (for integer class labels)."""
    if num_classes < 2:
        raise ValueError("label flipping needs at least two classes")
    return (num_classes - 1) - labels


_STATELESS: dict[str, Attack] = {
    "alie": alie,
    "gaussian": gaussian,
    "ipm": ipm,
    "ipm_large": ipm_large,
    "label_flip": label_flip,
    "nan": nan,
    "sign_flip": sign_flip,
    "sparse_spike": sparse_spike,
}

# Names of attacks that act on the training data (the trainer applies flip_labels first).
ATTACKS_DATA_LEVEL = frozenset({"label_flip"})


def new_attack(name: str) -> Attack:
    """A fresh attack by name (a new StaleAttack for "stale", so attackers share no state)."""
    if name == "stale":
        return StaleAttack()
    if name not in _STATELESS:
        raise KeyError(f"unknown attack {name!r} (known: {', '.join(sorted(ATTACKS))})")
    return _STATELESS[name]


# All attacks by name. ATTACKS["stale"] is one process-wide StaleAttack: right for a node process
# that plays one attacker; use new_attack("stale") for several attackers in one process.
ATTACKS: dict[str, Attack] = dict(sorted({**_STATELESS, "stale": StaleAttack()}.items()))
