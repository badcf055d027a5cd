"""BanPolicy: rejected -> at once; repeated outlier -> recommended; honest non-iid -> never."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.datasets import load_digits

from cnode.aggregation import (
    ATTACKS,
    AggregationInputError,
    AggregatorConfig,
    BanPolicy,
    EvidenceKind,
    TensorSpec,
    aggregate,
    limits,
)

from .conftest import SPEC, make_updates


def _round(ups, policy, rnd):
    res = aggregate(ups, expected=SPEC, config=AggregatorConfig())
    cids = {p: f"bafk-{p}-{rnd}" for p in ups}
    return res, policy.observe(rnd, res.records, cids)


def test_rejected_update_is_recommended_at_once_with_evidence() -> None:
    policy = BanPolicy()
    ups = make_updates(6)
    ups["peer05"] = ATTACKS["nan"]([], ups["peer05"], torch.Generator(), 6, 1)
    _, recs = _round(ups, policy, 1)
    assert [r.peer for r in recs] == ["peer05"]
    rec = recs[0]
    assert rec.round == 1 and rec.update_cid == "bafk-peer05-1"
    assert rec.kind is EvidenceKind.REJECTED and "not finite" in rec.reason
    payload = rec.to_payload()
    assert payload["kind"] == "rejected" and "not finite" in payload["figures"]["rejected"]
    _, again = _round(ups, policy, 2)
    assert again == []  # recommended once


def test_outlier_in_k_of_m_rounds_is_recommended() -> None:
    policy = BanPolicy(k=3, m=5)
    g = torch.Generator().manual_seed(0)
    found = []
    for rnd in range(1, 8):
        ups = make_updates(8, seed=rnd)
        honest = [u for p, u in ups.items() if p != "peer07"]
        if rnd % 2:  # an attacker that misbehaves every other round
            ups["peer07"] = ATTACKS["gaussian"](honest, ups["peer07"], g, 8, 1)
        _, recs = _round(ups, policy, rnd)
        found += recs
    assert [r.peer for r in found] == ["peer07"]
    rec = found[0]
    assert rec.round == 5 and rec.kind is EvidenceKind.OUTLIER
    assert rec.reason == "outlier in 3 of the last 5 rounds"  # the words people read
    assert rec.figures["rounds"] == [1, 3, 5]
    assert all(s > limits.OUTLIER_SCORE for s in rec.figures["scores"])
    assert rec.figures["update_cids"] == ["bafk-peer07-1", "bafk-peer07-3", "bafk-peer07-5"]
    assert all(w < 0.1 for w in rec.figures["clip_weights"])


def test_rounds_must_increase_and_k_m_checked() -> None:
    policy = BanPolicy()
    policy.observe(3, {}, {})
    with pytest.raises(AggregationInputError, match="round 3 observed after round 3"):
        policy.observe(3, {}, {})
    with pytest.raises(AggregationInputError, match="1 <= k <= m"):
        BanPolicy(k=4, m=3)


def test_honest_heterogeneous_peers_are_not_banned_synthetic() -> None:
    """Persistent per-peer offsets of very different sizes (0.3x..2.5x) plus noise, 30 rounds."""
    g = torch.Generator().manual_seed(11)
    n = 10
    offsets = [
        {k: torch.randn(s.shape, generator=g) * (0.3 + 2.2 * i / (n - 1)) for k, s in SPEC.items()}
        for i in range(n)
    ]
    policy = BanPolicy()
    worst = 0.0
    for rnd in range(30):
        mu = {k: torch.randn(s.shape, generator=g) * 0.5 for k, s in SPEC.items()}
        ups = {
            f"peer{i:02d}": {
                k: mu[k] + offsets[i][k] + 0.5 * torch.randn(s.shape, generator=g)
                for k, s in SPEC.items()
            }
            for i in range(n)
        }
        res, recs = _round(ups, policy, rnd)
        assert recs == []
        worst = max(worst, max(r.score or 0.0 for r in res.records.values()))
    assert worst < limits.OUTLIER_SCORE


def _softmax_grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(x @ w, dim=1)
    p[torch.arange(len(y)), y] -= 1
    return x.T @ p / len(y)


def test_honest_noniid_digits_peers_are_not_banned() -> None:
    """Label-skewed shards (Dirichlet 0.3) of the digits data, softmax regression, 25 rounds."""
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16
    y = torch.tensor(d.target)
    torch.manual_seed(5)
    n = 10
    shares = torch.distributions.Dirichlet(torch.full((n,), 0.3)).sample((10,))  # class x peer
    shards: list[list[int]] = [[] for _ in range(n)]
    for c in range(10):
        idx = (y == c).nonzero().flatten().tolist()
        cuts = [0, *(math.floor(v) for v in shares[c].cumsum(0) * len(idx))]
        for p in range(n):
            shards[p] += idx[cuts[p] : cuts[p + 1]]
    w = torch.zeros(64, 10)
    spec = {"w": TensorSpec((64, 10), torch.float32)}
    policy = BanPolicy()
    for rnd in range(25):
        ups = {
            f"peer{p:02d}": {"w": -0.5 * _softmax_grad(w, x[shards[p]], y[shards[p]])}
            for p in range(n)
            if shards[p]
        }
        res = aggregate(ups, expected=spec, config=AggregatorConfig())
        assert policy.observe(rnd, res.records, {}) == []
        w = w + res.tensors["w"]
