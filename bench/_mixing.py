"""Helpers of bench/robustness.py: the bench-only update transforms of --pre (specs/aggregation.md
"Non-iid shards") and the partitioned aggregation of --mode partitioned."""

from __future__ import annotations

import torch

from cnode.aggregation import (
    PARTITION_TENSOR,
    AggregatorConfig,
    aggregate_partition,
    combine_records,
    flat_segments,
    partition_count,
    partition_segments,
    segment_ranges,
)


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


def aggregate_partitioned(
    received: dict[str, dict[str, torch.Tensor]],
    like: dict[str, torch.Tensor],
    config: AggregatorConfig,
    members: int,
    segment: int,
) -> dict[str, torch.Tensor]:
    """Aggregate each of partition_count(members, segments) contiguous partitions of the flat
    update apart (issue 10), segments of ``segment`` values; ban records by combine_records."""
    numel = sum(t.numel() for t in like.values())
    ranges = segment_ranges(numel, segment)
    parts = partition_count(members, len(ranges))
    flats = {p: torch.cat(flat_segments(u, segment)) for p, u in received.items()}
    out = torch.zeros(numel, dtype=torch.float32)
    records = []
    for part in range(parts):
        segs = partition_segments(len(ranges), parts, part)
        a, b = ranges[segs[0]][0], ranges[segs[-1]][1]
        res = aggregate_partition({p: f[a:b].contiguous() for p, f in flats.items()}, config)
        out[a:b] = res.tensors[PARTITION_TENSOR]
        records.append(res.records)
    combine_records(records)  # the round's ban records, as the node builds them
    return _unflat(out, like)
