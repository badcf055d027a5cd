"""aggregate(by_layer=True): the same bits as the whole-update path, holding one layer at a time.

A full round's aggregation at 1B parameters cannot hold n decoded updates (issue 27). With
``by_layer`` the stack looks each layer up when its first block is read and drops it when the
next one starts, so mappings that decode a layer on lookup hold n x one layer. The bits must not
change: every accumulator column still adds in layer-then-chunk order.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import ClassVar

import pytest
import torch

from cnode.aggregation import AGGREGATORS, AggregatorConfig, TensorSpec, aggregate, limits

from .conftest import digest, make_updates

# Several W-chunks in one layer, a layer that is not a multiple of the tile, a tiny one, an empty
# one, and a bfloat16 one (gathered in float32, widened exactly).
SPEC = {
    "a.weight": TensorSpec((2, limits.CHUNK_ELEMENTS - 5), torch.float32),
    "b.bias": TensorSpec((7,), torch.float32),
    "c.empty": TensorSpec((0, 4), torch.float32),
    "d.weight": TensorSpec((1000, 33), torch.bfloat16),
}
PARAMS: list[tuple[str, dict[str, object]]] = [
    *[(name, {}) for name in sorted(AGGREGATORS)],
    ("centered_clip", {"start": "previous"}),
    ("centered_clip", {"reject_score": 0.0}),
]


class Decoding(Mapping[str, torch.Tensor]):
    """A stand-in for a node's decode-on-lookup update: each lookup makes a new tensor (as
    decoding from the block store would) and says which layers were alive at that moment."""

    alive: ClassVar[list[tuple[str, weakref.ref[torch.Tensor]]]] = []
    worst: ClassVar[int] = 0

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        live = [n for n, ref in Decoding.alive if ref() is not None and n != name]
        Decoding.worst = max(Decoding.worst, len(live))
        out = self.tensors[name].clone()
        Decoding.alive.append((name, weakref.ref(out)))
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


@pytest.mark.parametrize(("name", "params"), PARAMS)
def test_by_layer_gives_the_same_bits_on_random_inputs(name: str, params: dict) -> None:
    for seed in (1,):
        updates = make_updates(6, SPEC, seed=seed)
        updates["peer05"] = {k: v * 40 for k, v in updates["peer05"].items()}  # an outlier
        weights = {p: float(i + 1) for i, p in enumerate(sorted(updates))}
        previous = make_updates(1, SPEC, seed=seed + 10)["peer00"]
        config = AggregatorConfig(name, params)
        whole = aggregate(updates, expected=SPEC, config=config, weights=weights, previous=previous)
        layered = aggregate(
            {p: Decoding(u) for p, u in updates.items()},
            expected=SPEC,
            config=config,
            weights=weights,
            previous=previous,
            by_layer=True,
        )
        assert digest(layered) == digest(whole)
        assert layered.records == whole.records
        assert layered.params == whole.params


def test_by_layer_holds_one_layer_of_each_update_at_a_time() -> None:
    Decoding.alive, Decoding.worst = [], 0
    updates = {p: Decoding(u) for p, u in make_updates(5, SPEC, seed=4).items()}
    aggregate(updates, expected=SPEC, config=AggregatorConfig("centered_clip"), by_layer=True)
    assert Decoding.alive, "the layers were looked up"
    # When a layer is looked up, at most one tensor of another layer is alive (validation looks
    # the next layer up while it holds the last one it checked): the stack dropped the previous
    # layer of every update before reading the next one (5 updates would leave 5 alive).
    assert Decoding.worst <= 1
    assert all(ref() is None for _, ref in Decoding.alive)  # and nothing is kept after
