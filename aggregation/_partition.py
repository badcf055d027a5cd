"""Partitioned aggregation (BTARD's ButterflyClip): cut the flat update, aggregate each part apart.

An update (tensor name -> float32 tensor) is read as one flat vector: the tensors in sorted name
order, each flattened row-major. That vector is cut into *segments* of a fixed number of values
(the last one shorter), and the segments into P contiguous *partitions*. Each partition is
aggregated on its own, by the run's rule, as one 1-D tensor named ``"partition"``; the per-peer
records of all partitions then combine into one record per peer (:func:`combine_records`).

Everything here is a pure, deterministic function of its arguments: every node computes the same
assignment, the same ranges and, from the same inputs, the same bytes. See specs/aggregation.md
"Partitioned aggregation" and specs/training.md#partitioned-rounds.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Mapping, Sequence

import torch

from . import limits
from ._aggregate import aggregate
from ._exceptions import AggregationInputError
from ._types import AggregationResult, AggregatorConfig, PeerRecord, TensorSpec

__all__ = [
    "PARTITION_TENSOR",
    "aggregate_partition",
    "assign_partitions",
    "backup_aggregators",
    "combine_records",
    "flat_segments",
    "partition_count",
    "partition_segments",
    "segment_ranges",
    "unflatten_segments",
    "verification_choice",
]

# The name of the one tensor a partition is aggregated as.
PARTITION_TENSOR = "partition"


def segment_ranges(numel: int, segments: int = limits.SEGMENTS) -> list[tuple[int, int]]:
    """The [start, stop) value ranges of the segments of a flat vector of ``numel`` values:
    ``min(segments, numel)`` contiguous ranges, segment ``i`` from ``i * numel // count``."""
    if numel < 1 or segments < 1:
        raise AggregationInputError("segment_ranges needs numel >= 1 and segments >= 1")
    count = min(segments, numel)
    return [(i * numel // count, (i + 1) * numel // count) for i in range(count)]


def partition_count(members: int, segments: int) -> int:
    """How many partitions a round of ``members`` members cuts ``segments`` segments into."""
    if members < 1 or segments < 1:
        raise AggregationInputError("partition_count needs members >= 1 and segments >= 1")
    return min(members, segments)


def partition_segments(segments: int, parts: int, part: int) -> range:
    """The segment indices of partition ``part`` of ``parts``: contiguous, sizes differ by <= 1.
    A segment is the unit of work: partition ``p`` of an update is the layers of those
    segments, a list of chunk CIDs anyone can fetch."""
    if not 0 <= part < parts <= segments:
        raise AggregationInputError(f"partition {part} of {parts} over {segments} segments")
    return range(part * segments // parts, (part + 1) * segments // parts)


def flat_segments(
    tensors: Mapping[str, torch.Tensor], segments: int = limits.SEGMENTS
) -> list[torch.Tensor]:
    """The segments of ``tensors`` read as one flat float32 vector (sorted names, row-major)."""
    flat = torch.cat([tensors[n].detach().reshape(-1).to(torch.float32) for n in sorted(tensors)])
    return [flat[a:b].contiguous() for a, b in segment_ranges(flat.numel(), segments)]


def unflatten_segments(
    segments: Sequence[torch.Tensor], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """The inverse of :func:`flat_segments`: name -> float32 tensor of ``shapes[name]``.

    The tensors are views into one new flat vector (the segments are copied once, never
    shared with the caller's).
    """
    flat = torch.cat([s.reshape(-1) for s in segments]) if segments else torch.empty(0)
    want = sum(math.prod(shape) for shape in shapes.values())
    if flat.numel() != want:
        raise AggregationInputError(f"segments hold {flat.numel()} values, the shapes {want}")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name in sorted(shapes):
        n = math.prod(shapes[name])
        out[name] = flat[offset : offset + n].view(shapes[name])
        offset += n
    return out


def _rank(run: str, round_: int, peer: str) -> bytes:
    return hashlib.sha256(f"cnode/partition/v1\n{run}\n{round_}\n{peer}".encode()).digest()


def assign_partitions(run: str, round_: int, members: Sequence[str], parts: int) -> list[str]:
    """Who aggregates each partition: the members ordered by sha256("cnode/partition/v1\\n" run
    "\\n" round "\\n" peer), partition ``p`` to the ``p``-th. A fresh order each round, fixed by
    the coordinator's signed member list, so no member picks its partition."""
    if len(set(members)) != len(members):
        raise AggregationInputError("assign_partitions: members must be distinct")
    if not 1 <= parts <= len(members):
        raise AggregationInputError(f"{parts} partitions for {len(members)} members")
    order = sorted(members, key=lambda m: _rank(run, round_, m))
    return order[:parts]


def backup_aggregators(run: str, round_: int, members: Sequence[str], part: int) -> list[str]:
    """Who takes partition ``part`` over, in order, when its aggregator publishes no result:
    the members after it in the assignment order, wrapping around."""
    order = sorted(members, key=lambda m: _rank(run, round_, m))
    if not 0 <= part < len(order):
        raise AggregationInputError(f"partition {part} of a round of {len(order)} members")
    return order[part + 1 :] + order[:part]


def verification_choice(
    seed: bytes, verifier: str, parts: int, count: int, exclude: Sequence[int] = ()
) -> list[int]:
    """The ``count`` partitions ``verifier`` recomputes: ordered by sha256(seed || verifier ||
    partition), never one in ``exclude`` (its own). ``seed`` must be fixed only after every
    result of the round is out (the hash of all result header CIDs), so no aggregator knows in
    advance whether its partition will be checked, nor by whom."""
    skip = set(exclude)
    candidates = [p for p in range(parts) if p not in skip]
    key = {
        p: hashlib.sha256(seed + verifier.encode() + p.to_bytes(4, "big")).digest()
        for p in candidates
    }
    return sorted(sorted(candidates, key=key.__getitem__)[: max(count, 0)])


def aggregate_partition(
    updates: Mapping[str, torch.Tensor],
    config: AggregatorConfig,
    previous: torch.Tensor | None = None,
) -> AggregationResult:
    """Aggregate one partition: peer id -> its 1-D float32 slice of the flat update.

    The run's rule with its parameters, exactly as :func:`aggregate` runs it on a one-tensor
    update, so the determinism rules (chunk width, tile, peer order) are the same.
    """
    lengths = {t.numel() for t in updates.values() if isinstance(t, torch.Tensor)}
    if len(lengths) != 1:
        # A wrong length is the sender's fault: aggregate() rejects it by shape, with the reason.
        lengths = {max(lengths)} if lengths else {0}
    (length,) = lengths
    if length < 1:
        raise AggregationInputError("aggregate_partition needs a non-empty partition")
    spec = {PARTITION_TENSOR: TensorSpec((length,), torch.float32)}
    prev = None if previous is None else {PARTITION_TENSOR: previous}
    return aggregate(
        {peer: {PARTITION_TENSOR: t} for peer, t in updates.items()},
        expected=spec,
        config=config,
        previous=prev,
    )


def combine_records(
    per_partition: Sequence[Mapping[str, PeerRecord]],
) -> dict[str, PeerRecord]:
    """One record per peer from the records of every partition of a round.

    - rejected in any partition: rejected, with the first partition's reason (a malformed or
      non-finite slice is as self-proving as a malformed whole update);
    - otherwise: distance = sqrt(sum of the partitions' squared distances), the distance of its
      whole update to the whole aggregate; clip weight = the smallest of its partitions';
      score = distance / median distance of the accepted peers, outlier = score > OUTLIER_SCORE,
      exactly as :func:`aggregate` scores a full-replication round.

    A peer missing from some partitions (an aggregator could not fetch its slice) is combined
    over the partitions that have it.
    """
    peers = sorted({p for records in per_partition for p in records})
    rejected: dict[str, str] = {}
    squares: dict[str, float] = {}
    clips: dict[str, float | None] = {}
    weights: dict[str, float] = {}
    for part, records in enumerate(per_partition):
        for peer, rec in records.items():
            if rec.rejected is not None:
                rejected.setdefault(peer, f"partition {part}: {rec.rejected}")
                continue
            squares[peer] = squares.get(peer, 0.0) + float(rec.distance or 0.0) ** 2
            weights[peer] = rec.weight
            if rec.clip_weight is not None:
                old = clips.get(peer)
                clips[peer] = rec.clip_weight if old is None else min(old, rec.clip_weight)
            else:
                clips.setdefault(peer, None)
    accepted = [p for p in peers if p not in rejected and p in squares]
    distances = {p: math.sqrt(squares[p]) for p in accepted}
    typical = statistics.median(distances.values()) if distances else 0.0
    out: dict[str, PeerRecord] = {}
    for peer in peers:
        if peer in rejected:
            out[peer] = PeerRecord(peer, None, None, rejected[peer], weight=0.0)
            continue
        d = distances[peer]
        score = d / typical if typical > 0 else (0.0 if d == 0 else math.inf)
        out[peer] = PeerRecord(
            peer,
            d,
            clips.get(peer),
            None,
            weight=weights.get(peer, 1.0),
            score=score,
            outlier=score > limits.OUTLIER_SCORE,
        )
    return out
