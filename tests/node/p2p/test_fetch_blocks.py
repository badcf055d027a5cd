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


def test_small_blocks_are_kept_and_served_without_a_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks up to INLINE_BLOCK_BYTES are hashed, stored (in the fetch's batch) and read by the
    holder on the loop's thread; a larger block still takes its worker thread at each of the
    three steps (specs/blocks.md#threads). Every block is still verified: the stores check."""
    from cnode.node.p2p import limits

    holder = BlockStore(tmp_path / "holder")
    small = [holder.put_new(i.to_bytes(4, "big") * 100) for i in range(40)]  # 400 B each
    large = [holder.put_new(bytes([i]) * (limits.INLINE_BLOCK_BYTES + 1)) for i in range(3)]
    store = BlockStore(tmp_path / "fetcher")
    hops: list[str] = []
    real_run_sync = trio.to_thread.run_sync

    async def counted(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await real_run_sync(fn, *args, **kwargs)

    async def main() -> None:
        b_id = Identity.generate()
        async with (
            open_p2p_node(b_id, holder, LOOPBACK, allow=bool) as b,
            open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as a,
        ):
            with trio.fail_after(20):
                await a.connect(b.listen_addrs[0])
                monkeypatch.setattr(trio.to_thread, "run_sync", counted)
                report = await a.fetch_blocks(small, [b_id.peer_id_str])
                assert report.blocks == len(small)
                per_block = [h for h in hops if h in ("_checked", "store_block", "get")]
                assert per_block == []  # the batch's begin and commit are the only hops
                assert sorted(hops) == ["begin_unsynced", "commit"]
                hops.clear()
                await a.fetch_blocks(large, [b_id.peer_id_str])
                for step in ("_checked", "store_block", "get"):
                    assert hops.count(step) == len(large), (step, hops)

    trio.run(main)
    assert all(store.check(c)[0] == "ok" for c in [*small, *large])
