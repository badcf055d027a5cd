"""Each bad update is rejected with a clear reason before the math, and harms nothing."""

from __future__ import annotations

import math

import pytest
import torch

from cnode.aggregation import (
    AggregatorConfig,
    NotEnoughUpdatesError,
    TensorSpec,
    aggregate,
    validate_update,
)

from .conftest import SPEC, digest, make_updates


def _good() -> dict[str, torch.Tensor]:
    return make_updates(1)["peer00"]


def _with(name: str, value: object) -> dict[str, object]:
    u: dict[str, object] = dict(_good())
    u[name] = value
    return u


def _nan() -> dict[str, torch.Tensor]:
    u = _good()
    u["layer.weight"][3, 4] = math.nan
    return u


def _inf() -> dict[str, torch.Tensor]:
    u = _good()
    u["layer.bias"][0] = -math.inf
    return u


BAD = {
    "not a mapping": ([1, 2], "update is a list, not a mapping"),
    "missing": ({"layer.bias": torch.zeros(7)}, "missing tensors: 'layer.weight'"),
    "extra": (_with("evil", torch.zeros(1)), "unexpected tensors: 'evil'"),
    "shape": (_with("layer.bias", torch.zeros(8)), "'layer.bias' has shape (8,), expected (7,)"),
    "dtype": (
        _with("layer.bias", torch.zeros(7, dtype=torch.float64)),
        "'layer.bias' has dtype torch.float64, expected torch.float32",
    ),
    "not tensor": (_with("layer.bias", [0.0] * 7), "'layer.bias' is a list, not a tensor"),
    "sparse": (_with("layer.bias", torch.zeros(7).to_sparse()), "not a dense CPU tensor"),
    "nan": (_nan(), "'layer.weight' is not finite (1 NaN, 0 Inf)"),
    "inf": (_inf(), "'layer.bias' is not finite (0 NaN, 1 Inf)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_update_reason(case: str) -> None:
    update, reason = BAD[case]
    got = validate_update(update, SPEC)
    assert got is not None and reason in got


def test_good_update_passes() -> None:
    assert validate_update(_good(), SPEC) is None


@pytest.mark.parametrize("case", sorted(BAD))
def test_rejected_update_does_not_reach_the_math(case: str) -> None:
    honest = make_updates(5)
    before = {p: {k: v.clone() for k, v in u.items()} for p, u in honest.items()}
    clean = aggregate(honest, expected=SPEC, config=AggregatorConfig())
    mixed = dict(honest) | {"peer99": BAD[case][0]}
    res = aggregate(mixed, expected=SPEC, config=AggregatorConfig())  # type: ignore[arg-type]
    assert digest(res) == digest(clean)
    rec = res.records["peer99"]
    assert rec.rejected is not None and BAD[case][1] in rec.rejected
    assert rec.distance is None and rec.weight == 0.0
    assert res.params["rejected"] == 1
    for p, u in honest.items():  # inputs untouched
        assert all(torch.equal(u[k], before[p][k]) for k in u)


def test_bad_peer_id_is_rejected() -> None:
    ups = make_updates(3)
    ups["x" * 200] = _good()
    res = aggregate(ups, expected=SPEC, config=AggregatorConfig("mean"))
    assert res.records["x" * 200].rejected == "peer id is too long or not printable"


def test_all_rejected_raises() -> None:
    with pytest.raises(NotEnoughUpdatesError, match="no valid update among 2 received"):
        aggregate({"a": _nan(), "b": _inf()}, expected=SPEC, config=AggregatorConfig())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_non_finite_found_at_any_position(dtype: torch.dtype) -> None:
    """The finiteness check is one min/max pass: NaN and Inf must show wherever they sit."""
    n = 100_003
    spec = {"t": TensorSpec((n,), dtype)}
    for pos in (0, 1, 15, 16, 31, 32, 4097, n // 2, n - 2, n - 1):
        for bad in (math.nan, math.inf, -math.inf):
            t = torch.zeros(n, dtype=dtype)
            t[pos] = bad
            reason = validate_update({"t": t}, spec)
            assert reason is not None and "is not finite" in reason, (pos, bad)
