"""Partitioned aggregation primitives (specs/aggregation.md "Partitioned aggregation")."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from cnode.aggregation import (
    AggregationInputError,
    AggregatorConfig,
    PeerRecord,
    TensorSpec,
    aggregate,
    aggregate_partition,
    assign_partitions,
    backup_aggregators,
    combine_records,
    flat_segments,
    limits,
    partition_count,
    partition_segments,
    segment_ranges,
    unflatten_segments,
    verification_choice,
)

PEERS = [f"12D3KooWpeer{i:02d}" for i in range(7)]


def test_segments_cover_the_vector_once_in_equal_parts() -> None:
    for numel in (1, 63, 64, 65, 10_152_000):
        ranges = segment_ranges(numel)
        assert len(ranges) == min(numel, limits.SEGMENTS)
        assert ranges[0][0] == 0 and ranges[-1][1] == numel
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        sizes = {b - a for a, b in ranges}
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    with pytest.raises(AggregationInputError):
        segment_ranges(0)


def test_flat_segments_round_trip_in_sorted_name_order() -> None:
    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.arange(100.0, 104.0)}
    segments = flat_segments(tensors, segments=3)
    assert torch.equal(torch.cat(segments), torch.tensor([100, 101, 102, 103, 0, 1, 2, 3, 4, 5.0]))
    back = unflatten_segments(segments, {n: tuple(t.shape) for n, t in tensors.items()})
    assert all(torch.equal(back[n], tensors[n]) for n in tensors)
    with pytest.raises(AggregationInputError, match="segments hold 10 values"):
        unflatten_segments(segments, {"a": (4,)})


def test_partitions_split_segments_evenly() -> None:
    for members in (1, 3, 4, 16, 100):
        parts = partition_count(members, limits.SEGMENTS)
        assert parts == min(members, limits.SEGMENTS)
        covered = [i for p in range(parts) for i in partition_segments(limits.SEGMENTS, parts, p)]
        assert covered == list(range(limits.SEGMENTS))
        sizes = [len(partition_segments(limits.SEGMENTS, parts, p)) for p in range(parts)]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(AggregationInputError):
        partition_segments(64, 4, 4)


def test_assignment_is_fixed_by_the_member_list_and_changes_each_round() -> None:
    one = assign_partitions("run", 5, PEERS, 7)
    assert sorted(one) == sorted(PEERS)
    assert assign_partitions("run", 5, list(reversed(PEERS)), 7) == one  # order does not matter
    assert assign_partitions("run", 6, PEERS, 7) != one
    assert assign_partitions("run", 5, PEERS, 3) == one[:3]
    backups = backup_aggregators("run", 5, PEERS, 2)
    assert backups == one[3:] + one[:2]
    with pytest.raises(AggregationInputError, match="distinct"):
        assign_partitions("run", 5, [PEERS[0], PEERS[0]], 1)
    with pytest.raises(AggregationInputError):
        assign_partitions("run", 5, PEERS, 8)


def test_verification_choice_is_seeded_and_never_the_verifiers_own() -> None:
    seed = bytes(32)
    chosen = verification_choice(seed, PEERS[0], 7, 2, exclude=[3])
    assert len(chosen) == 2 and 3 not in chosen
    assert verification_choice(seed, PEERS[0], 7, 2, exclude=[3]) == chosen
    others = {tuple(verification_choice(bytes([i]) * 32, PEERS[0], 7, 2, [3])) for i in range(20)}
    assert len(others) > 1  # another seed, another choice
    assert verification_choice(seed, PEERS[0], 3, 5, exclude=[0]) == [1, 2]
    assert verification_choice(seed, PEERS[0], 3, 0) == []


def test_a_partition_aggregates_like_a_one_tensor_update() -> None:
    gen = torch.Generator().manual_seed(1)
    slices = {p: torch.randn(5000, generator=gen) for p in PEERS[:5]}
    slices[PEERS[4]] = slices[PEERS[4]] * 50
    config = AggregatorConfig()
    got = aggregate_partition(slices, config)
    want = aggregate(
        {p: {"partition": t} for p, t in slices.items()},
        expected={"partition": TensorSpec((5000,), torch.float32)},
        config=config,
    )
    assert torch.equal(got.tensors["partition"], want.tensors["partition"])
    assert got.records == want.records
    bad = dict(slices)
    bad[PEERS[0]] = torch.full((5000,), math.nan)
    assert aggregate_partition(bad, config).records[PEERS[0]].rejected is not None


def test_records_combine_into_whole_update_distances() -> None:
    a = {p: PeerRecord(p, 3.0, 1.0, None) for p in PEERS[:4]}
    b = {p: PeerRecord(p, 4.0, 0.5 if p == PEERS[0] else 1.0, None) for p in PEERS[:4]}
    b[PEERS[3]] = PeerRecord(PEERS[3], None, None, "non-finite values in 'partition'")
    combined = combine_records([a, b])
    assert combined[PEERS[0]].distance == 5.0 and combined[PEERS[0]].clip_weight == 0.5
    assert combined[PEERS[3]].rejected == "partition 1: non-finite values in 'partition'"
    assert combined[PEERS[1]].score == 1.0 and not combined[PEERS[1]].outlier
    far = {**a, PEERS[2]: PeerRecord(PEERS[2], 300.0, 0.01, None)}
    assert combine_records([far])[PEERS[2]].outlier
