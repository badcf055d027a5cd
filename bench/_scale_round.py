"""bench/scale.py's full round: PEERS synthetic peers' updates, the aggregation by layer, the
new state stored as the round's checkpoint, and ``verify --replay`` of that round.

Each function here runs in its own child process of bench/scale.py (``--child NAME``) and
returns (RSS before the phase, start time, figures); the caller adds seconds and peak RSS.

The synthetic updates are built straight in the int8-blockwise layout of
specs/training.md#codecs (per segment: ``B`` float32 scales, then one int8 per value), one
segment at a time, each stored before the next is made (``store_update`` reads a sequence
lazily): the generator holds one encoded segment (M / 256 at 1B), never an update. Encoding
random float32 values instead cost 1.8 s per 15.6M-value segment, 27 minutes for 7 peers at
1B; random codes cost 0.1 s. Every stored segment decodes (SegmentedUpdate decodes all of them
before the aggregation starts, and refuses a malformed one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

PEERS = 7  # the other members of a full round whose updates one node aggregates
CODEC = "int8-blockwise"
SCALE = 1e-3  # the updates' magnitude against the state's 0.02; the last peer's is 30x


class SyntheticUpdate(Sequence[torch.Tensor]):
    """Peer ``peer``'s encoded segments of a ``numel``-value update, each made on lookup from
    its own seed (the same bytes every time it is looked up)."""

    def __init__(self, numel: int, peer: int) -> None:
        from cnode.aggregation import segment_ranges
        from cnode.aggregation.limits import CODEC_BLOCK

        self.ranges, self.block, self.peer = segment_ranges(numel), CODEC_BLOCK, peer
        self.scale = SCALE * (30 if peer == PEERS - 1 else 1)

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        start, stop = self.ranges[i]
        n = stop - start
        blocks = math.ceil(n / self.block)
        g = torch.Generator().manual_seed(100_000 * (self.peer + 1) + i)
        out = torch.empty(4 * blocks + n, dtype=torch.uint8)
        out[: 4 * blocks].view(torch.float32).uniform_(
            0.9 * self.scale / 127, 1.1 * self.scale / 127, generator=g
        )
        out[4 * blocks :].view(torch.int8).random_(-127, 128, generator=g)
        return out


def _config() -> Any:
    from cnode.node.train import TrainingConfig

    return TrainingConfig.from_dict({"update_codec": CODEC})


def setup(size: str, store: Any, state: Callable[[str], dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Store the parent checkpoint (round 0) and PEERS signed round-1 updates on it."""
    from cnode.auth import Identity
    from cnode.node.train import UpdateHeader, seal_update_header, state_cid, store_update
    from cnode.node.train.checkpoint import store_checkpoint
    from cnode.storage import DAG_CBOR

    config = _config()
    parent = state(size)
    numel = sum(t.numel() for t in parent.values())
    parent_cid = store_checkpoint(
        store, parent, run="b", round_=0, parent=None, config=config, rounds=[], tokenizer_json="{}"
    )
    base = state_cid(parent)
    del parent
    headers = []
    for i in range(PEERS):
        identity = Identity.from_seed(bytes([i + 1]) * 32)
        update = store_update(
            store, SyntheticUpdate(numel, i), run="b", round_=1, base=base, codec=CODEC
        )
        header = UpdateHeader("b", 1, identity.peer_id_str, 1, update, base)
        headers.append(str(store.put_new(seal_update_header(identity, header), DAG_CBOR)))
    return {"parent": str(parent_cid), "headers": headers}


def _updates(
    store: Any, headers: Sequence[str], opened: Callable[..., Any], parent: Any
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The round's updates by peer (opened with ``opened``) and their header CIDs in peer order."""
    from cnode.node.train import open_update_header
    from cnode.storage import CID

    updates, cids = {}, {}
    for cid in map(CID.parse, headers):
        header = open_update_header(store.get(cid), run="b", round_=1)
        updates[header.peer] = opened(
            store, header.update, peer=header.peer, codec=CODEC, shapes=parent
        )
        cids[header.peer] = cid
    return dict(sorted(updates.items())), tuple(cids[p] for p in sorted(cids))


def aggregate(
    size: str,
    store: Any,
    state: Callable[[str], dict[str, torch.Tensor]],
    peak: Callable[[], int],
    setup_out: dict[str, Any],
    *,
    streamed: bool,
) -> tuple[int, float, dict[str, Any]]:
    """A full round as a node past WHOLE_UPDATES_MAX_BYTES does it (``streamed``: each update a
    SegmentedUpdate, ``aggregate_round(by_layer=True)``, then the new state stored as the
    round's checkpoint), or the whole-update path (``load_update`` of each; not stored)."""
    import time

    from cnode.node.train import SegmentedUpdate, aggregate_round, load_update
    from cnode.node.train.checkpoint import RoundLog, store_checkpoint
    from cnode.storage import CID

    config = _config()
    parent = state(size)
    before = peak()  # the parent state is the round's own, not the phase's
    start = time.perf_counter()
    updates, cids = _updates(
        store, setup_out["headers"], SegmentedUpdate if streamed else load_update, parent
    )
    opened = time.perf_counter() - start
    result = aggregate_round(parent, updates, config, by_layer=streamed)
    del updates, parent
    out: dict[str, Any] = {
        "state_cid": str(result.state_cid),
        "opened_s": opened,
        "iterations": result.aggregation.params.get("iterations"),
    }
    if streamed:
        aggregated = time.perf_counter()
        rounds = [RoundLog(1, result.state_cid, cids, result.aggregation.params)]
        out["checkpoint"] = str(
            store_checkpoint(
                store,
                result.state,
                run="b",
                round_=1,
                parent=CID.parse(setup_out["parent"]),
                config=config,
                rounds=rounds,
                tokenizer_json="{}",
            )
        )
        out["store_s"] = time.perf_counter() - aggregated
    return before, start, out


def replay(store: Any, cid: str, peak: Callable[[], int]) -> tuple[int, float, dict[str, Any]]:
    """``cnode checkpoint verify --replay``'s replay of the round's checkpoint (the parent
    loaded, the updates opened and aggregated again, every layer's chunk CIDs compared)."""
    import time

    from cnode.node.train import replay_checkpoint
    from cnode.storage import CID

    before, start = peak(), time.perf_counter()
    report = replay_checkpoint(store, CID.parse(cid))
    return before, start, {"state_cid": str(report.state_cid), "rounds": list(report.rounds)}


def block_bytes(root: Path) -> int:
    """The bytes of every block file under ``root``'s ``blocks`` folder."""
    return sum(f.stat().st_size for f in (root / "blocks").rglob("*") if f.is_file())
