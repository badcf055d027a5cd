"""fetch_update_segments: a partition's part of an update in one fetch, one manifest pass.

Two real nodes on loopback in one process (specs/training.md#partitioned-rounds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio

from cnode.auth import Identity
from cnode.node.p2p import P2PNode, P2PSettings, open_p2p_node
from cnode.node.train import fetch_update_segments
from cnode.node.train._round import segment_layer, store_update
from cnode.storage import CID, DAG_CBOR, BlockStore, ManifestError, read_manifest
from cnode.storage._cbor import encode

LOOPBACK = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))


def _update(store: BlockStore) -> CID:
    gen = torch.Generator().manual_seed(3)
    encoded = [
        torch.randint(0, 255, (700 + i,), dtype=torch.uint8, generator=gen) for i in range(64)
    ]
    return store_update(store, encoded, run="r", round_=1, base=store.put_new(b"base"))


def test_a_partition_is_one_fetch_with_each_node_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = BlockStore(tmp_path / "holder")
    update = _update(holder)
    store = BlockStore(tmp_path / "fetcher")
    calls: list[str] = []
    real_fetch, real_blocks = P2PNode.fetch, P2PNode.fetch_blocks

    async def fetch(self: P2PNode, *args: object, **kwargs: object) -> object:
        calls.append("fetch")
        return await real_fetch(self, *args, **kwargs)  # type: ignore[arg-type]

    async def fetch_blocks(self: P2PNode, *args: object, **kwargs: object) -> object:
        calls.append("fetch_blocks")
        return await real_blocks(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(P2PNode, "fetch", fetch)
    monkeypatch.setattr(P2PNode, "fetch_blocks", fetch_blocks)
    served: list[int] = []

    async def main() -> None:
        b_id = Identity.generate()
        async with (
            open_p2p_node(b_id, holder, LOOPBACK, allow=bool) as b,
            open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as a,
        ):
            with trio.fail_after(30):
                await a.connect(b.listen_addrs[0])
                got = await fetch_update_segments(a, update, [3, 40], [b_id.peer_id_str])
                assert got > 0
                assert calls == ["fetch"]  # one fetch: root, then its chunks as it arrives
                served.append(b.server.requests_served)
                # Everything held: nothing fetched, no request.
                assert await fetch_update_segments(a, update, [3, 40], [b_id.peer_id_str]) == 0
                assert b.server.requests_served == served[0]

    trio.run(main)
    manifest = read_manifest(store, update)  # every node held: the manifest reads
    wanted = {segment_layer(3), segment_layer(40)}
    for layer in manifest.layers:
        held = [store.has(c) for c in layer.chunks]
        assert all(held) if layer.name in wanted else not any(held), layer.name
    # The root, then its two chunks in one request: a few KB, not split over the holder's
    # workers (specs/blocks.md#fetching 12; it was one request per chunk before issue 41's).
    assert served == [2]


def test_a_malformed_manifest_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    holder = BlockStore(tmp_path / "holder")
    fake = holder.put_new(encode({"type": "not-a-manifest"}), DAG_CBOR)
    store = BlockStore(tmp_path / "fetcher")

    async def main() -> None:
        b_id = Identity.generate()
        async with (
            open_p2p_node(b_id, holder, LOOPBACK, allow=bool) as b,
            open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as a,
        ):
            with trio.fail_after(30):
                await a.connect(b.listen_addrs[0])
                with pytest.raises(ManifestError, match="manifest"):
                    await fetch_update_segments(a, fake, [0], [b_id.peer_id_str])

    trio.run(main)
