"""Shared helpers for the aggregation tests: seeded synthetic updates."""

from __future__ import annotations

import hashlib

import pytest
import torch

from cnode.aggregation import AggregationResult, TensorSpec

SPEC = {
    "layer.bias": TensorSpec((7,), torch.float32),
    "layer.weight": TensorSpec((30, 50), torch.float32),
}


def make_updates(
    n: int, spec: dict[str, TensorSpec] = SPEC, seed: int = 0, prefix: str = "peer"
) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {
        f"{prefix}{i:02d}": {
            name: (torch.randn(s.shape, generator=g, dtype=torch.float64) * 0.3 + 0.1).to(s.dtype)
            for name, s in spec.items()
        }
        for i in range(n)
    }


def digest(result: AggregationResult) -> str:
    h = hashlib.sha256()
    for name in sorted(result.tensors):
        h.update(name.encode())
        h.update(result.tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
