"""Bit-identical output: any order of the same updates, repeated runs, any thread count."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest
import torch

from cnode.aggregation import AGGREGATORS, AggregatorConfig, TensorSpec, aggregate, limits, tree_sum

from .conftest import digest, make_updates

FIXTURE = Path(__file__).parents[2] / "specs" / "fixtures" / "aggregation" / "golden.json"

# Large enough to span several chunks and exceed torch's parallel grain size (32768).
BIG = {
    "a": TensorSpec((300, 500), torch.float32),
    "b": TensorSpec((limits.CHUNK_ELEMENTS + 3,), torch.float32),
    "c": TensorSpec((11,), torch.bfloat16),
}


def _run(name: str, updates, spec, weights=None):
    return aggregate(updates, expected=spec, config=AggregatorConfig(name), weights=weights)


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_permutations_and_repeats_are_bitwise_identical(name: str) -> None:
    updates = make_updates(9, seed=3)
    updates["peer08"] = {k: v * 50 for k, v in updates["peer08"].items()}  # one outlier
    weights = {p: float(i + 1) for i, p in enumerate(sorted(updates))}
    first = _run(name, updates, make_spec(), weights)
    want = digest(first)
    rng = random.Random(7)
    for _ in range(4):
        items = list(updates.items())
        rng.shuffle(items)
        again = _run(name, dict(items), make_spec(), weights)
        assert digest(again) == want
        assert again.records == first.records
        assert again.params == first.params


def make_spec():
    from .conftest import SPEC

    return SPEC


@pytest.mark.parametrize("name", ["centered_clip", "mean", "median", "krum"])
def test_thread_count_does_not_change_bits(name: str) -> None:
    updates = make_updates(8, spec=BIG, seed=5)
    updates["peer07"] = {k: -4 * v for k, v in updates["peer07"].items()}
    digests = set()
    for threads in (1, 2, 1):
        torch.set_num_threads(threads)
        digests.add(digest(_run(name, updates, BIG)))
    assert len(digests) == 1


def test_tree_sum_is_close_to_exact_and_order_fixed() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 100_003, generator=g, dtype=torch.float64)
    rows = tree_sum(x, 1)
    import math

    for i in range(3):
        assert abs(float(rows[i]) - math.fsum(x[i].tolist())) < 1e-9
    cols = tree_sum(x, 0)
    assert torch.equal(cols, tree_sum(x.clone(), 0))
    assert torch.allclose(cols, x.sum(0))
    assert tree_sum(torch.zeros(2, 0, dtype=torch.float64), 1).tolist() == [0.0, 0.0]


def _decode(entry: dict) -> torch.Tensor:
    dtype = getattr(torch, entry["dtype"])
    raw = bytearray(base64.b64decode(entry["data"]))
    return torch.frombuffer(raw, dtype=dtype).reshape(entry["shape"]).clone()


def test_golden_fixture() -> None:
    """specs/fixtures/aggregation/golden.json: inputs as little-endian bytes, output digests."""
    data = json.loads(FIXTURE.read_text())
    spec = {
        n: TensorSpec(tuple(s["shape"]), getattr(torch, s["dtype"]))
        for n, s in data["spec"].items()
    }
    updates = {p: {n: _decode(e) for n, e in u.items()} for p, u in data["updates"].items()}
    for name, case in data["expected"].items():
        res = aggregate(
            updates,
            expected=spec,
            config=AggregatorConfig.from_dict(case["config"]),
            weights=data["weights"],
        )
        assert digest(res) == case["sha256"], name
        assert res.rejected == data["rejected"]


def test_chunk_width_depends_on_n_only() -> None:
    from cnode.aggregation._kernels import chunk_width

    assert chunk_width(1) == chunk_width(16) == limits.CHUNK_ELEMENTS
    assert chunk_width(17) == limits.CHUNK_ELEMENTS // 2
    assert chunk_width(4096) == limits.MIN_CHUNK_ELEMENTS
    assert all(chunk_width(n) * n <= limits.WORK_ELEMENTS for n in range(1, 1025))


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_tile_width_does_not_change_bits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles (limits.TILE_*) decide speed only: narrow, default and whole-chunk tiles agree."""
    updates = make_updates(7, spec=BIG, seed=9)
    updates["peer06"] = {k: -20 * v for k, v in updates["peer06"].items()}
    weights = {p: float(i + 2) for i, p in enumerate(sorted(updates))}
    digests = set()
    for tile, work in ((1 << 10, 1 << 10), (1 << 13, 1 << 16), (1 << 16, 1 << 30)):
        monkeypatch.setattr(limits, "TILE_ELEMENTS", tile)
        monkeypatch.setattr(limits, "MIN_TILE_ELEMENTS", min(tile, limits.MIN_TILE_ELEMENTS))
        monkeypatch.setattr(limits, "TILE_WORK_ELEMENTS", work)
        res = _run(name, updates, BIG, weights)
        digests.add((digest(res), tuple(r.distance for r in res.records.values())))
    assert len(digests) == 1


def test_tree_sum_rows_in_place_matches_tree_sum() -> None:
    from cnode.aggregation._kernels import tree_sum_rows_

    g = torch.Generator().manual_seed(2)
    for rows in (1, 2, 3, 5, 7, 16, 17):
        x = torch.randn(rows, 1001, generator=g, dtype=torch.float64)
        assert torch.equal(tree_sum_rows_(x.clone()), tree_sum(x, 0))
