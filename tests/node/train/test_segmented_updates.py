"""A full round read one layer at a time (SegmentedUpdate + aggregate_round(by_layer=True)) gives
the state the whole-update path gives, bit for bit; a malformed update is refused when it is
opened, as before (issue 27: a full round at 1B parameters cannot hold n decoded updates)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cnode.node.train import MalformedUpdateError, TrainingConfig
from cnode.node.train._round import (
    aggregate_round,
    encode_update,
    load_update,
    store_update,
    streams_updates,
)
from cnode.node.train._segmented import SegmentedUpdate
from cnode.node.train.limits import WHOLE_UPDATES_MAX_BYTES
from cnode.storage import CID, BlockStore, compute_cid

CONFIG = TrainingConfig.from_dict({"update_codec": "int8-blockwise"})
# Layers that do not line up with the 64 segments: some span several, some share one.
SHAPES = {"a": (300, 7), "b": (5,), "c": (41, 13), "d": (1,), "e": (2, 600)}
BASE = compute_cid(b"a parent state", 0x71)


def _stored(store: BlockStore, seed: int) -> tuple[CID, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    delta = {k: torch.randn(s, generator=g) * (1 + seed % 3) for k, s in SHAPES.items()}
    encoded, _ = encode_update(delta, "int8-blockwise")
    cid = store_update(store, encoded, run="r", round_=1, base=BASE, codec="int8-blockwise")
    return cid, delta


def test_layer_by_layer_is_the_whole_round_bit_for_bit(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "s")
    parent = {
        k: torch.randn(s, generator=torch.Generator().manual_seed(99)) for k, s in SHAPES.items()
    }
    cids = {f"peer{i}": _stored(store, i)[0] for i in range(3)}
    kw = {"codec": "int8-blockwise", "shapes": parent}
    whole = {p: load_update(store, c, peer=p, **kw) for p, c in cids.items()}  # type: ignore[arg-type]
    lazy = {p: SegmentedUpdate(store, c, peer=p, **kw) for p, c in cids.items()}  # type: ignore[arg-type]
    for p in cids:
        assert list(lazy[p]) == sorted(SHAPES)
        for name in SHAPES:
            assert torch.equal(lazy[p][name], whole[p][name])
    a = aggregate_round(parent, whole, CONFIG)
    b = aggregate_round(parent, lazy, CONFIG, by_layer=True)
    assert a.state_cid == b.state_cid
    assert a.aggregation.records == b.aggregation.records


def test_a_malformed_update_is_refused_when_opened(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "s")
    shapes = {k: torch.zeros(s) for k, s in SHAPES.items()}
    encoded, _ = encode_update(shapes, "int8-blockwise")
    short = [e[:-1] if i == 40 else e for i, e in enumerate(encoded)]  # one segment cut short
    cid = store_update(store, short, run="r", round_=1, base=BASE, codec="int8-blockwise")
    with pytest.raises(MalformedUpdateError, match="segment 40"):
        SegmentedUpdate(store, cid, peer="p", codec="int8-blockwise", shapes=shapes)


def test_which_rounds_stream() -> None:
    small = {"w": torch.zeros(1000)}
    assert not streams_updates(255, small)
    numel = WHOLE_UPDATES_MAX_BYTES // 4 // 8 + 1  # 8 decoded updates just past the limit
    big = {"w": torch.empty(numel, dtype=torch.float32)}
    assert streams_updates(8, big) and not streams_updates(7, big)


class _Counted(list[torch.Tensor]):
    """Encoded segments that count their lookups (iterating a list would not count)."""

    def __init__(self, items: list[torch.Tensor]) -> None:
        super().__init__(items)
        self.lookups = 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self.lookups += 1
        return super().__getitem__(i)


def test_store_update_reads_segments_on_lookup_and_stores_the_same_update(tmp_path: Path) -> None:
    # A sequence that makes each segment when it is looked up (bench/scale.py's synthetic peers at
    # 1B) is stored one segment at a time: store_update does not build a dict of every segment.
    delta = {
        k: torch.randn(s, generator=torch.Generator().manual_seed(5)) for k, s in SHAPES.items()
    }
    encoded, _ = encode_update(delta, "int8-blockwise")
    store = BlockStore(tmp_path / "s")
    plain = store_update(store, list(encoded), run="r", round_=1, base=BASE, codec="int8-blockwise")
    counted = _Counted(list(encoded))
    lazy = store_update(store, counted, run="r", round_=1, base=BASE, codec="int8-blockwise")
    assert lazy == plain
    assert counted.lookups == 2 * len(encoded)  # checked, then written: looked up each time
