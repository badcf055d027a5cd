"""The aggregation rules, each on a :class:`Stack` of accepted updates ordered by peer id.

Every rule returns a :class:`RuleOutput`: the float64 aggregate (flattened per layer), the
per-peer clip weights where the rule has them, the distances when the rule computed them anyway,
and the parameters it actually used. See specs/aggregation.md for the definitions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import limits
from ._exceptions import NotEnoughUpdatesError
from ._kernels import Chunk, Stack, select_rows, tree_sum, tree_sum_rows_

__all__ = ["RULES", "RuleOutput", "default_f"]


@dataclass
class RuleOutput:
    vector: dict[str, torch.Tensor]  # float64, flattened per layer
    clip_weights: list[float | None]  # per accepted peer, in stack order
    sq_distances: torch.Tensor | None = None  # to ``vector``, when already known
    params: dict[str, Any] = field(default_factory=dict)


Rule = Callable[
    [Stack, list[float], Mapping[str, Any], Mapping[str, torch.Tensor] | None], RuleOutput
]


def default_f(n: int) -> int:
    """Attackers assumed by trimmed mean and Krum when ``f`` is not set: the most below n/2."""
    return max(0, (n - 1) // 2)


def _weighted_sum(
    stack: Stack, coef: list[float] | None, divisor: float
) -> dict[str, torch.Tensor]:
    """tree_sum over peers of coef_i * x_i (x_i when coef is None), divided by ``divisor``."""
    v = stack.new_vector()
    col = None if coef is None else torch.tensor(coef, dtype=torch.float64).reshape(-1, 1)
    for tile, x in stack.iter_tiles():
        if col is not None:
            x.mul_(col)
        vc = v[tile.name][tile.start : tile.stop]
        torch.div(tree_sum_rows_(x), divisor, out=vc)
    return v


def _mean(
    stack: Stack, weights: list[float], params: Mapping[str, Any], previous: Any
) -> RuleOutput:
    v = _weighted_sum(stack, None, float(stack.n))
    return RuleOutput(v, [1.0] * stack.n)


def _weighted_mean(
    stack: Stack, weights: list[float], params: Mapping[str, Any], previous: Any
) -> RuleOutput:
    total = math.fsum(weights)  # exactly rounded: independent of order
    v = _weighted_sum(stack, weights, total)
    return RuleOutput(v, [1.0] * stack.n)


def _order_stats(
    stack: Stack, block: Chunk, gathered: torch.Tensor, ranks: tuple[int, ...]
) -> list[torch.Tensor]:
    """The rank-r values of every column of ``gathered`` (left intact), for r in ranks.

    Works on a canonicalised copy (-0.0 -> +0.0: min/max cannot then pick a zero's sign) in
    reused buffers; the returned rows are valid until the next call.
    """
    net = stack.buffer("net", block.size, gathered.dtype)
    torch.add(gathered, 0.0, out=net)
    spare = stack.buffer("spare", block.size, gathered.dtype, rows=1)[0]
    return select_rows(net, ranks, spare)


def _median_into(stack: Stack, v: dict[str, torch.Tensor], acc: torch.Tensor | None = None) -> None:
    """Coordinate-wise median into ``v``; with ``acc``, also the squared distances to it.

    One pass: each chunk is gathered once, for the median and then for the distances.
    """
    n = stack.n
    ranks = ((n - 1) // 2, n // 2)
    for chunk in stack.chunks:
        gathered = stack.gather(chunk)
        lo, hi = _order_stats(stack, chunk, gathered, ranks)
        vc = v[chunk.name][chunk.start : chunk.stop]
        vc.copy_(lo)  # exact: float32 (or float64) into float64
        if n % 2 == 0:
            vc.add_(hi)  # in float64, as lo.double() + hi.double()
            vc.mul_(0.5)
        if acc is not None:
            for tile in stack.tiles(chunk):
                x = stack.widen(gathered, chunk, tile)
                x.sub_(vc[tile.pos : tile.pos + tile.size])
                stack.accumulate_sq(acc, x, tile)


def _median(
    stack: Stack, weights: list[float], params: Mapping[str, Any], previous: Any
) -> RuleOutput:
    v = stack.new_vector()
    _median_into(stack, v)
    return RuleOutput(v, [None] * stack.n)


def _trimmed_mean(
    stack: Stack, weights: list[float], params: Mapping[str, Any], previous: Any
) -> RuleOutput:
    n = stack.n
    f = int(params.get("f", default_f(n)))
    if n - 2 * f < 1:
        raise NotEnoughUpdatesError(
            f"trimmed mean with f={f} needs more than {2 * f} updates, got {n}"
        )
    v = stack.new_vector()
    for chunk in stack.chunks:
        kept = _order_stats(stack, chunk, stack.gather(chunk), tuple(range(f, n - f)))
        v[chunk.name][chunk.start : chunk.stop] = tree_sum(torch.stack(kept).double(), 0) / float(
            n - 2 * f
        )
    return RuleOutput(v, [None] * n, params={"f": f})


def _krum(
    stack: Stack, weights: list[float], params: Mapping[str, Any], previous: Any
) -> RuleOutput:
    n = stack.n
    f = int(params.get("f", default_f(n)))
    neighbours = n - f - 2
    if neighbours < 1 and n > 1:
        raise NotEnoughUpdatesError(f"Krum with f={f} needs at least {f + 3} updates, got {n}")
    accs = [stack.new_accumulator() for _ in range(n)]  # n x (n x W): Krum is for small n
    for tile, x in stack.iter_tiles():
        for i in range(n):
            stack.accumulate_sq(accs[i], x - x[i], tile)
    pair = torch.stack([stack.reduce(a) for a in accs])
    rows = pair.tolist()
    scores = []
    for i in range(n):
        others = sorted(rows[i][j] for j in range(n) if j != i)
        scores.append(math.fsum(others[:neighbours]))
    chosen = min(range(n), key=lambda i: (scores[i], i))  # ties: lowest peer id
    v = stack.new_vector()
    for tile, x in stack.iter_tiles():
        v[tile.name][tile.start : tile.stop] = x[chosen]
    return RuleOutput(
        v,
        [1.0 if i == chosen else 0.0 for i in range(n)],
        sq_distances=pair[chosen].clone(),
        params={"f": f, "chosen_index": chosen},
    )


def _clip_weights(dist: list[float], tau: float, reject: float) -> list[float]:
    """min(1, tau/d); 0 for a peer farther than ``reject`` x the median distance (if reject > 0).

    Clipping alone still lets each far-away peer pull the aggregate by tau; f coherent ones
    move it by about f/(n-f) x tau. Dropping peers that are unambiguous outliers removes that
    pull; peers inside the rejection radius keep the usual clipped weight.
    """
    limit = reject * statistics.median(dist) if reject > 0 else math.inf
    return [0.0 if d > limit else (1.0 if d <= tau else tau / d) for d in dist]


def _centered_clip(
    stack: Stack,
    weights: list[float],
    params: Mapping[str, Any],
    previous: Mapping[str, torch.Tensor] | None,
) -> RuleOutput:
    """CenteredClip: v <- v + sum_i w_i c_i (x_i - v) / sum_i w_i c_i, c_i = min(1, tau/d_i).

    normalize="all" divides by sum_i w_i as in the paper; the default divides by the clipped
    weights (the IRLS form): the same fixed points, reached in a few iterations instead of ~15.

    One pass over the data per iteration: each chunk is moved to the new v and, in the same
    pass, the squared distances to the new v (for the next iteration's clip weights) and the
    squared step length are accumulated.
    """
    start = params.get("start", "median")
    max_iter = int(params.get("max_iterations", limits.CLIP_MAX_ITERATIONS))
    tolerance = float(params.get("tolerance", limits.CLIP_TOLERANCE))
    tau_scale = float(params.get("tau_scale", limits.CLIP_TAU_SCALE))
    reject = float(params.get("reject_score", limits.CLIP_REJECT_SCORE))
    normalize = params.get("normalize", "clipped")
    fixed_tau = params.get("tau")

    v = stack.new_vector()
    acc = stack.new_accumulator()
    sq, used_start = _clip_start(stack, v, acc, start, previous)
    dist = [math.sqrt(d) for d in sq.tolist()]
    start_median = statistics.median(dist)
    tau = float(fixed_tau) if fixed_tau is not None else tau_scale * start_median

    total = math.fsum(weights)
    share = [w / total for w in weights]
    iterations = 0
    step = 0.0
    step_acc = stack.new_accumulator(rows=1)
    if tau > 0.0:
        for _ in range(max_iter):
            clip = _clip_weights(dist, tau, reject)
            coef = [s * c for s, c in zip(share, clip, strict=True)]
            if normalize == "clipped":
                kept = math.fsum(coef)
                coef = [c / kept for c in coef] if kept > 0 else coef
            sq, step = _clip_pass(stack, v, acc, step_acc, coef)
            dist = [math.sqrt(d) for d in sq.tolist()]
            iterations += 1
            if step <= tolerance * tau:
                break
    clip = _clip_weights(dist, tau, reject)
    return RuleOutput(
        v,
        list(clip),
        sq_distances=sq,
        params={
            "tau": tau,
            "tau_rule": "fixed" if fixed_tau is not None else "scale_free",
            "tau_scale": tau_scale,
            "reject_score": reject,
            "normalize": normalize,
            "start": used_start,
            "start_median_distance": start_median,
            "iterations": iterations,
            "last_step": step,
            "max_iterations": max_iter,
            "tolerance": tolerance,
        },
    )


def _clip_start(
    stack: Stack,
    v: dict[str, torch.Tensor],
    acc: torch.Tensor,
    start: str,
    previous: Mapping[str, torch.Tensor] | None,
) -> tuple[torch.Tensor, str]:
    """Put CenteredClip's start into ``v``; return the squared distances to it and its name."""
    if start == "previous" and previous is not None:
        for name in stack.names:
            v[name].copy_(previous[name].detach().reshape(-1))
        return stack.sq_distances(v), "previous"
    _median_into(stack, v, acc)  # one pass: the start and the distances to it
    return stack.reduce(acc), "median"


def _clip_pass(
    stack: Stack,
    v: dict[str, torch.Tensor],
    acc: torch.Tensor,
    step_acc: torch.Tensor,
    coef: list[float],
) -> tuple[torch.Tensor, float]:
    """One CenteredClip iteration over the data: move each chunk of ``v`` by the ``coef``
    weighted sum of (x_i - v); return the squared distances to the new v and the step length."""
    col = torch.tensor(coef, dtype=torch.float64).reshape(-1, 1)
    acc.zero_()
    step_acc.zero_()
    for tile, x in stack.iter_tiles():
        vc = v[tile.name][tile.start : tile.stop]
        d = stack.buffer("work", tile.size)
        torch.sub(x, vc, out=d)
        d.mul_(col)
        delta = tree_sum_rows_(d)  # a view of d[0]
        vc.add_(delta)  # in place: v now holds the new point for this tile
        stack.accumulate_sq(step_acc, delta.reshape(1, -1), tile)
        x.sub_(vc)  # x is this tile's own copy
        stack.accumulate_sq(acc, x, tile)
    return stack.reduce(acc), math.sqrt(float(stack.reduce(step_acc)[0]))


RULES: Mapping[str, Rule] = {
    "mean": _mean,
    "weighted_mean": _weighted_mean,
    "median": _median,
    "trimmed_mean": _trimmed_mean,
    "krum": _krum,
    "centered_clip": _centered_clip,
}
