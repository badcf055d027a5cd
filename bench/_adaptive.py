"""Adaptive attackers of bench/robustness.py (issue 24).

They know everything public (the rule and its bars, the shard assignment, the held-out split)
and the round's honest updates, but not the round's seed; all f send the same update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from cnode.aggregation import ATTACKS, UpdateScore, admission

Params = dict[str, torch.Tensor]
Forward = Callable[[Params, torch.Tensor], torch.Tensor]
Score = Callable[
    [Params, Mapping[str, Params], Mapping[str, tuple[torch.Tensor, torch.Tensor]],
     tuple[torch.Tensor, torch.Tensor], bytes],
    tuple[bytes, dict[str, UpdateScore]],
]  # fmt: skip


# Adaptive attackers (issue 24): they know everything public (the rule and its bars, the shard
# assignment, the held-out split) and the round's honest updates, but not the round's seed; all
# f send the same update. "blind": the honest mean reversed, with the component its sender's own
# data sees (its own-data gradient) removed, added to its own honest delta; "bar": its own delta
# minus k x the honest mean, k the largest in K_GRID that its own simulation of the round (on
# batches it draws itself, with cnode.aggregation.left_out_reason: every bar, the own floor too)
# admits; "alie": within the honest spread (cnode.aggregation's alie);
# "inflate": its own delta plus INFLATE x its distance from the honest mean, to drag the centre;
# "stall" (issue 36, stall_update): each attacker sends -STALL_SCALE x its own honest delta, a
# small update that the scores leave out every round (it makes its own data a little worse)
# without the blatant harm of a sign flip: before issue 36 such rejected updates froze the
# partitioned rounds of a default swarm. (An update that helps its own data, however little,
# is admitted: 1 % of the own delta was, in 96 % of rounds, and then stalls nothing.)
ADAPTIVE = ("blind", "bar", "alie_adaptive", "inflate", "stall")
STALL_SCALE = 0.25
K_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
INFLATE = 10.0


def _flat(u: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([u[k].flatten() for k in sorted(u)])


def _unflat(v: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for k in sorted(like):
        n = like[k].numel()
        out[k] = v[i : i + n].reshape(like[k].shape).clone()
        i += n
    return out


def _grad(
    forward: Forward, glob: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    p = {k: v.unsqueeze(0).clone().requires_grad_() for k, v in glob.items()}
    loss = torch.nn.functional.cross_entropy(forward(p, x.unsqueeze(0))[0], y)
    grads = torch.autograd.grad(loss, [p[k] for k in sorted(p)])
    return torch.cat([g.flatten() for g in grads])


def adaptive_update(
    kind: str,
    glob: dict[str, torch.Tensor],
    mine: dict[str, torch.Tensor],
    honest: list[dict[str, torch.Tensor]],
    own: tuple[torch.Tensor, torch.Tensor],
    others: dict[str, tuple[torch.Tensor, torch.Tensor]],
    held: tuple[torch.Tensor, torch.Tensor],
    rng: torch.Generator,
    n: int,
    f: int,
    *,
    forward: Forward,
    score: Score,
) -> dict[str, torch.Tensor]:
    """The update all f attackers send this round (see the module docstring)."""
    stack = torch.stack([_flat(u) for u in honest])
    mean, d = stack.mean(0), _flat(mine)
    if kind == "alie_adaptive":
        return ATTACKS["alie"](honest, mine, rng, n, f)
    if kind == "inflate":
        return _unflat(d + INFLATE * (d - mean), mine)
    if kind == "blind":
        g = _grad(forward, glob, *own)
        w = -mean + (mean @ g) / (g @ g).clamp_min(1e-30) * g  # -mean without the seen part
        return _unflat(d + w * (d.norm() / w.norm().clamp_min(1e-30)), mine)
    if kind == "stall":
        return stall_update(mine)
    # "bar": simulate the round on its own batches (they do not know the seed),
    # through the node's admission (cnode.aggregation.admission: every bar, the own floor too).
    guess = bytes(torch.randint(0, 256, (32,), generator=rng, dtype=torch.uint8).tolist())
    best = d
    for k in K_GRID:
        cand = d - k * mean
        ups = {f"h{i}": u for i, u in enumerate(honest)}
        ups |= {f"z{i}": _unflat(cand, mine) for i in range(f)}
        data = {f"h{i}": v for i, v in enumerate(others.values())}
        data |= {f"z{i}": own for i in range(f)}
        _, scores = score(glob, ups, data, held, guess)
        decided = admission(scores, {})
        ours = [f"z{i}" for i in range(f)]
        if all(z in decided.admitted for z in ours):
            best = cand
    return _unflat(best, mine)


def stall_update(mine: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The stall attacker's update: -STALL_SCALE x its own honest delta (see ADAPTIVE)."""
    return {k: -STALL_SCALE * v for k, v in mine.items()}
