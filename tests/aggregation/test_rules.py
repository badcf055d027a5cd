"""Each rule against a plain reference, and CenteredClip's robustness and parameters."""

from __future__ import annotations

import pytest
import torch

from cnode.aggregation import (
    AggregationInputError,
    AggregatorConfig,
    AggregatorConfigError,
    NotEnoughUpdatesError,
    aggregate,
)

from .conftest import SPEC, make_updates


def _stack(updates, name):
    return torch.stack([updates[p][name].double() for p in sorted(updates)])


def _agg(updates, name="centered_clip", weights=None, previous=None, **params):
    return aggregate(
        updates,
        expected=SPEC,
        config=AggregatorConfig(name, params),
        weights=weights,
        previous=previous,
    )


def test_mean_and_weighted_mean_match_reference() -> None:
    ups = make_updates(6)
    res = _agg(ups, "mean")
    w = {p: float(i + 1) for i, p in enumerate(sorted(ups))}
    wres = _agg(ups, "weighted_mean", weights=w)
    wt = torch.tensor([w[p] for p in sorted(ups)], dtype=torch.float64)
    for name in SPEC:
        x = _stack(ups, name)
        assert torch.allclose(res.tensors[name].double(), x.mean(0), atol=1e-6)
        ref = (x * wt.reshape(-1, *[1] * (x.dim() - 1))).sum(0) / wt.sum()
        assert torch.allclose(wres.tensors[name].double(), ref, atol=1e-6)
        assert res.tensors[name].dtype == SPEC[name].dtype
        assert tuple(res.tensors[name].shape) == SPEC[name].shape


def test_median_and_trimmed_mean_match_reference() -> None:
    ups = make_updates(7)
    med = _agg(ups, "median")
    trim = _agg(ups, "trimmed_mean", f=2)
    for name in SPEC:
        x = _stack(ups, name)
        assert torch.equal(med.tensors[name].double(), x.median(0).values)
        ref = x.sort(0).values[2:5].mean(0)
        assert torch.allclose(trim.tensors[name].double(), ref, atol=1e-6)
    even = make_updates(4)
    got = _agg(even, "median").tensors["layer.bias"].double()
    srt = _stack(even, "layer.bias").sort(0).values
    assert torch.allclose(got, (srt[1] + srt[2]) / 2, atol=1e-7)


def test_krum_picks_an_honest_update() -> None:
    ups = make_updates(8)
    for p in ("peer06", "peer07"):
        ups[p] = {k: v * 40 for k, v in ups[p].items()}
    res = _agg(ups, "krum", f=2)
    chosen = [p for p, r in res.records.items() if r.clip_weight == 1.0]
    assert len(chosen) == 1 and chosen[0] not in ("peer06", "peer07")
    assert all(torch.equal(res.tensors[k], ups[chosen[0]][k]) for k in SPEC)


def test_centered_clip_without_outliers_is_the_mean_when_tau_is_large() -> None:
    ups = make_updates(6)
    res = _agg(ups, tau=1e6)
    for name in SPEC:
        assert torch.allclose(res.tensors[name].double(), _stack(ups, name).mean(0), atol=1e-6)
    assert res.params["tau_rule"] == "fixed"


def test_centered_clip_resists_large_outliers_where_mean_fails() -> None:
    ups = make_updates(10)
    honest = {p: u for p, u in ups.items() if p < "peer06"}
    for i in range(6, 10):
        ups[f"peer{i:02d}"] = {k: torch.full_like(v, 1e4) for k, v in ups[f"peer{i:02d}"].items()}
    ref = {k: _stack(honest, k).mean(0) for k in SPEC}
    cc = _agg(ups)
    mean = _agg(ups, "mean")
    for name in SPEC:
        err_cc = (cc.tensors[name].double() - ref[name]).abs().max()
        err_mean = (mean.tensors[name].double() - ref[name]).abs().max()
        assert err_cc < 1.0 < err_mean
    assert cc.params["tau_rule"] == "scale_free" and cc.params["tau"] > 0
    assert 1 <= cc.params["iterations"] <= cc.params["max_iterations"]
    attackers = [r for p, r in cc.records.items() if p >= "peer06"]
    assert all(r.outlier and r.clip_weight is not None and r.clip_weight < 0.01 for r in attackers)
    assert not any(r.outlier for p, r in cc.records.items() if p < "peer06")


def test_tau_is_scale_free() -> None:
    """Scaling every update by c scales the aggregate by c: no absolute constant inside."""
    ups = make_updates(9)
    ups["peer08"] = {k: v * 30 for k, v in ups["peer08"].items()}
    base = _agg(ups)
    for c in (1e-4, 1e3):
        scaled = {p: {k: v * c for k, v in u.items()} for p, u in ups.items()}
        res = _agg(scaled)
        for name in SPEC:
            assert torch.allclose(res.tensors[name] / c, base.tensors[name], rtol=1e-4, atol=1e-6)
        assert res.params["tau"] == pytest.approx(base.params["tau"] * c, rel=1e-6)


def test_centered_clip_weights_and_previous_start() -> None:
    ups = make_updates(5)
    w = {p: 1.0 for p in ups} | {"peer00": 1000.0}
    res = _agg(ups, weights=w, tau=1e6)
    for name in SPEC:
        assert torch.allclose(res.tensors[name], ups["peer00"][name], atol=1e-2)
    prev = _agg(ups).tensors
    again = _agg(ups, previous=prev, start="previous")
    assert again.params["start"] == "previous"
    for name in SPEC:
        assert torch.allclose(again.tensors[name], prev[name], atol=1e-2)  # tau differs


def test_config_errors() -> None:
    with pytest.raises(AggregatorConfigError, match="unknown aggregator 'avg'"):
        AggregatorConfig("avg")
    with pytest.raises(AggregatorConfigError, match="takes no parameter 'tau'"):
        AggregatorConfig("mean", {"tau": 1.0})
    with pytest.raises(AggregatorConfigError, match=r"'tau' .* must be a finite number > 0"):
        AggregatorConfig("centered_clip", {"tau": -1.0})
    with pytest.raises(AggregatorConfigError, match=r"'start' .* must be one of"):
        AggregatorConfig("centered_clip", {"start": "zero"})
    with pytest.raises(AggregatorConfigError, match="wrong type"):
        AggregatorConfig("krum", {"f": 1.5})
    cfg = AggregatorConfig("centered_clip", {"tau_scale": 2.0, "start": "previous"})
    assert AggregatorConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(AggregatorConfigError):
        AggregatorConfig.from_dict({"name": "mean", "extra": 1})


def test_caller_errors() -> None:
    ups = make_updates(3)
    with pytest.raises(AggregationInputError, match="weighted_mean needs weights"):
        _agg(ups, "weighted_mean")
    with pytest.raises(AggregationInputError, match="no weight given for peer peer02"):
        _agg(ups, weights={"peer00": 1.0, "peer01": 1.0})
    with pytest.raises(AggregationInputError, match="must be a finite number > 0"):
        _agg(ups, weights=dict.fromkeys(ups, 0.0))
    with pytest.raises(AggregationInputError, match="previous aggregate is invalid"):
        _agg(ups, previous={"layer.bias": torch.zeros(7)})
    with pytest.raises(AggregationInputError, match="non-empty mapping"):
        aggregate(ups, expected={}, config=AggregatorConfig())
    with pytest.raises(NotEnoughUpdatesError, match="trimmed mean with f=2 needs more than 4"):
        _agg(ups, "trimmed_mean", f=2)
    with pytest.raises(NotEnoughUpdatesError, match="Krum with f=1 needs at least 4"):
        _agg(ups, "krum", f=1)
