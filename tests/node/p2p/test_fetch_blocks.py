"""P2PNode.fetch_blocks: a partition's chunks are fsynced together (specs/blocks.md#durability).

Two real nodes on loopback in one process. fsync calls are counted through ``os.fsync`` (the
OS's function, not ours).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from cnode.auth import Identity
from cnode.node.p2p import P2PSettings, open_p2p_node
from cnode.storage import BlockStore

LOOPBACK = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))


def test_several_blocks_sync_once_and_one_block_fsyncs_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = BlockStore(tmp_path / "holder")
    cids = [holder.put_new(i.to_bytes(4, "big") * 4096) for i in range(12)]
    single = holder.put_new(b"a signed header, say")
    store = BlockStore(tmp_path / "fetcher")
    fsyncs: list[int] = []
    real_fsync = os.fsync

    async def main() -> None:
        b_id = Identity.generate()
        async with (
            open_p2p_node(b_id, holder, LOOPBACK, allow=bool) as b,
            open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as a,
        ):
            with trio.fail_after(20):
                await a.connect(b.listen_addrs[0])
                monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
                report = await a.fetch_blocks(cids, [b_id.peer_id_str])
                assert report.blocks == len(cids)
                assert len(fsyncs) == 2  # the batch's marker and its folder, not 12 blocks
                fsyncs.clear()
                await a.fetch_blocks([single], [b_id.peer_id_str])
                assert len(fsyncs) == 1  # one block: its own fsync, no batch

    trio.run(main)
    assert all(store.check(c)[0] == "ok" for c in [*cids, single])
    assert list((store.root / "unsynced").iterdir()) == []  # committed: synced, marker gone
