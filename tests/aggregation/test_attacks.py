"""The attack harness: uniform signature, shapes kept, documented behaviour."""

from __future__ import annotations

import pytest
import torch

from cnode.aggregation import (
    ATTACKS,
    alie_z,
    flip_labels,
    new_attack,
    validate_update,
    worker_momentum,
)

from .conftest import SPEC, make_updates


def _setup():
    ups = make_updates(10)
    honest = [ups[f"peer{i:02d}"] for i in range(6)]
    return honest, ups["peer09"]


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_uniform_signature_keeps_names_shapes_dtypes(name: str) -> None:
    honest, own = _setup()
    out = new_attack(name)(honest, own, torch.Generator().manual_seed(0), 10, 4)
    assert set(out) == set(own)
    for k in own:
        assert out[k].shape == own[k].shape and out[k].dtype == own[k].dtype
    assert (validate_update(out, SPEC) is None) == (name != "nan")


def test_alie_z_from_n_and_f() -> None:
    assert alie_z(10, 4) == pytest.approx(0.8416, abs=1e-4)  # s = 2, z = Phi^-1(0.8)
    assert alie_z(10, 2) == pytest.approx(0.2533, abs=1e-4)  # s = 4, z = Phi^-1(0.6)
    honest, own = _setup()
    out = ATTACKS["alie"](honest, own, torch.Generator(), 10, 4)
    x = torch.stack([h["layer.bias"].double() for h in honest])
    ref = x.mean(0) - 0.8416 * x.std(0, correction=0)
    assert torch.allclose(out["layer.bias"].double(), ref, atol=1e-3)


def test_ipm_sign_flip_and_gaussian() -> None:
    honest, own = _setup()
    g = torch.Generator().manual_seed(0)
    mean = torch.stack([h["layer.weight"] for h in honest]).mean(0)
    assert torch.allclose(
        ATTACKS["ipm"](honest, own, g, 10, 4)["layer.weight"], -0.1 * mean, atol=1e-6
    )
    assert torch.allclose(
        ATTACKS["ipm_large"](honest, own, g, 10, 4)["layer.weight"], -10 * mean, atol=1e-5
    )
    assert torch.equal(
        ATTACKS["sign_flip"](honest, own, g, 10, 4)["layer.weight"], -own["layer.weight"]
    )
    noise = ATTACKS["gaussian"](honest, own, g, 10, 4)["layer.weight"]
    assert noise.std() > 20 * own["layer.weight"].std()


def test_stale_replays_an_old_update_and_instances_are_independent() -> None:
    a, b = new_attack("stale"), new_attack("stale")
    g = torch.Generator()
    seen = []
    for r in range(8):
        own = {k: torch.full(s.shape, float(r)) for k, s in SPEC.items()}
        seen.append(float(a([], own, g, 10, 1)["layer.bias"][0]))
    assert seen == [0, 0, 0, 0, 0, 0, 1, 2]
    assert (
        float(
            b([], {k: torch.full(s.shape, 7.0) for k, s in SPEC.items()}, g, 10, 1)["layer.bias"][0]
        )
        == 7
    )


def test_flip_labels_and_momentum() -> None:
    assert flip_labels(torch.tensor([0, 3, 9]), 10).tolist() == [9, 6, 0]
    u = {"a": torch.ones(3)}
    m = worker_momentum(None, u, 0.9)
    m = worker_momentum(m, {"a": torch.zeros(3)}, 0.9)
    assert torch.allclose(m["a"], torch.full((3,), 0.9))


def test_sparse_spike_puts_the_whole_norm_in_a_few_coordinates_against_the_mean() -> None:
    honest, own = _setup()
    out = ATTACKS["sparse_spike"](honest, own, torch.Generator(), 10, 4)
    flat = torch.cat([out[k].reshape(-1).double() for k in sorted(out)])
    norm = torch.cat([own[k].reshape(-1).double() for k in sorted(own)]).norm()
    kept = flat != 0
    assert int(kept.sum()) == max(1, -(-flat.numel() // 4096))
    assert float(flat.norm()) == pytest.approx(float(norm), rel=1e-5)
    mean = torch.cat(
        [torch.stack([u[k].reshape(-1).double() for u in honest]).mean(0) for k in sorted(own)]
    )
    assert bool((flat[kept].sign() == -mean[kept].sign()).all())
    assert float(mean[kept].abs().min()) >= float(mean[~kept].abs().max())
