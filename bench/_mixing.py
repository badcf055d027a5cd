"""Bench-only update transforms for bench/robustness.py --pre (specs/aggregation.md "Non-iid
shards"), and the flat-vector helpers they share with it."""

from __future__ import annotations

import torch


def _flat(update: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([update[k].double().reshape(-1) for k in sorted(update)])


def _unflat(vec: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, off = {}, 0
    for k in sorted(like):
        t = like[k]
        out[k] = vec[off : off + t.numel()].reshape(t.shape).to(t.dtype)
        off += t.numel()
    return out


def nnm(updates: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    """Nearest neighbour mixing (Allouah et al. 2023): each update becomes the mean of its n - f
    nearest updates (itself included; ties by peer id), f = the most below n/2 (the aggregator
    does not know the true f). Bench-only experiment; not deterministic across thread counts."""
    ids = sorted(updates)
    x = torch.stack([_flat(updates[p]) for p in ids])
    keep = len(ids) - (len(ids) - 1) // 2
    out = {}
    for i, p in enumerate(ids):
        d = ((x - x[i]) ** 2).sum(1).tolist()
        near = sorted(range(len(ids)), key=lambda j: (d[j], j))[:keep]
        out[p] = _unflat(x[near].mean(0), updates[p])
    return out


def bucket(
    updates: dict[str, dict[str, torch.Tensor]], size: int, seed: int
) -> dict[str, dict[str, torch.Tensor]]:
    """Bucketing (Karimireddy, He & Jaggi 2022): a permutation seeded by public round data
    (here the round number) cuts the sorted peers into buckets of ``size``; each bucket's mean is
    one input of the robust rule. Bench-only experiment."""
    ids = sorted(updates)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).tolist()
    out = {}
    for b in range(0, len(ids), size):
        group = [ids[i] for i in perm[b : b + size]]
        mean = torch.stack([_flat(updates[p]) for p in group]).mean(0)
        out[f"bucket{b // size:02d}"] = _unflat(mean, updates[group[0]])
    return out
