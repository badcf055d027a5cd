"""Fewer, larger block requests (issue 41; specs/blocks.md#fetching, 12): a fetch's requests are
sized by the blocks' expected bytes (``ClosureWalk.expected_size``), and what is left of a fetch
is not split over workers and holders into requests under ``MIN_SPLIT_BYTES``.

Real nodes on loopback in one process; requests are counted by the requester's ExchangeStats.
Before the rule, a fetch of 40 small chunks from one holder made 7 requests (the root, then 8
CIDs at a time, the count rule made for 1 MiB blocks), and from three holders one per worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import torch
import trio

from cnode.auth import Identity
from cnode.node.p2p import P2PNode, P2PSettings, fetch_purpose, limits, open_p2p_node
from cnode.storage import CID, BlockStore, CheckpointMeta, save_checkpoint

LOOPBACK = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))
SMALL_LAYERS = 40  # a sparse update's segments: a few hundred bytes each


def _small() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(41)
    return {f"segment.{i:03d}": torch.randn(100, generator=gen) for i in range(SMALL_LAYERS)}


def _big() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(42)
    return {f"h.{i}.w": torch.randn(262_144, generator=gen) for i in range(4)}  # 1 MiB each


def _held(tmp_path: Path, name: str, tensors: dict[str, torch.Tensor]) -> tuple[BlockStore, CID]:
    store = BlockStore(tmp_path / name)
    return store, save_checkpoint(store, tensors, CheckpointMeta(run_id="batching"))


@asynccontextmanager
async def _swarm(
    tmp_path: Path, holders: list[BlockStore]
) -> AsyncIterator[tuple[P2PNode, list[str]]]:
    """A requester with an empty store connected to one node per holder store."""
    async with AsyncExitStack() as stack:
        peers = []
        addrs = []
        for store in holders:
            identity = Identity.generate()
            node = await stack.enter_async_context(
                open_p2p_node(identity, store, LOOPBACK, allow=bool)
            )
            peers.append(identity.peer_id_str)
            addrs.append(node.listen_addrs[0])
        me = await stack.enter_async_context(
            open_p2p_node(Identity.generate(), BlockStore(tmp_path / "me"), LOOPBACK, allow=bool)
        )
        with trio.fail_after(60):
            for addr in addrs:
                await me.connect(addr)
            yield me, peers


def test_a_fetch_of_small_blocks_from_one_holder_is_two_requests(tmp_path: Path) -> None:
    """The root, then every chunk it lists (and the UnixFS view's blocks) in one request."""
    store, root = _held(tmp_path, "holder", _small())

    async def main() -> None:
        async with _swarm(tmp_path, [store]) as (me, peers):
            with fetch_purpose("scores"):
                report = await me.fetch(root, peers)
            assert report.blocks == sum(1 for _ in store.iter_cids())
            stats = me.traffic.exchange
            assert stats.requests == 2, stats.by_purpose
            assert set(stats.by_purpose) == {"scores/root", "scores/mixed"}  # chunks and view
            assert stats.by_purpose["scores/root"][:2] == [1, 1]

    trio.run(main)


def test_a_fetch_of_small_blocks_is_not_split_over_holders(tmp_path: Path) -> None:
    """Three holders of a few KB: one request for what the root lists, not one per worker."""
    stores = [_held(tmp_path, f"holder-{i}", _small()) for i in range(3)]
    root = stores[0][1]

    async def main() -> None:
        async with _swarm(tmp_path, [s for s, _ in stores]) as (me, peers):
            report = await me.fetch(root, peers)
            assert report.blocks == sum(1 for _ in stores[0][0].iter_cids())
            assert report.dropped == {}
            assert me.traffic.exchange.requests == 2, me.traffic.exchange.by_purpose

    trio.run(main)


def test_a_partition_of_small_segments_is_two_requests(tmp_path: Path) -> None:
    """What an aggregator fetches of a member's update (``layers``): the root, its chunks."""
    store, root = _held(tmp_path, "holder", _small())
    wanted = [f"segment.{i:03d}" for i in range(10, 30)]

    async def main() -> None:
        async with _swarm(tmp_path, [store]) as (me, peers):
            with fetch_purpose("segments"):
                report = await me.fetch(root, peers, layers=wanted)
            assert report.blocks == 1 + len(wanted)
            counts = {
                k: v[:2] for k, v in me.traffic.exchange.by_purpose.items()
            }  # requests, blocks
            assert counts == {"segments/root": [1, 1], "segments/chunks": [1, len(wanted)]}

    trio.run(main)


def test_large_blocks_are_still_spread_over_holders(tmp_path: Path) -> None:
    """MiB chunks over two holders: each holder serves part (the rule only keeps small fetches
    whole), in requests no larger than the even share."""
    stores = [_held(tmp_path, f"holder-{i}", _big()) for i in range(2)]
    root = stores[0][1]

    async def main() -> None:
        async with _swarm(tmp_path, [s for s, _ in stores]) as (me, peers):
            report = await me.fetch(root, peers)
            assert report.dropped == {}
            assert len(report.per_holder_bytes) == 2, report.per_holder_bytes
            assert me.traffic.exchange.requests >= 1 + limits.MAX_IN_FLIGHT_PER_HOLDER

    trio.run(main)


def test_a_small_fetch_goes_to_the_first_holder_named(tmp_path: Path) -> None:
    """Holders in the caller's order, the likeliest first (a result's aggregator, then every
    member): a fetch that is one request asks the first, not whichever worker runs first; named
    last, the holder is still reached, after one LACKING answer from each before it."""
    full, root = _held(tmp_path, "full", _small())
    empties = [BlockStore(tmp_path / f"empty-{i}") for i in range(2)]
    block = next(c for c in full.iter_cids() if c != root)

    async def main() -> None:
        async with _swarm(tmp_path, [full, *empties]) as (me, peers):
            stats = me.traffic.exchange
            for _ in range(5):  # trio may run any holder's workers first: it must not matter
                report = await me.fetch_blocks([block], peers)
                assert report.per_holder_bytes.keys() == {peers[0]}
                me.store.delete(block)
            assert stats.requests == 5
            await me.fetch(root, peers)
            assert stats.requests == 5 + 2, stats.by_purpose
            me.store.delete(block)
            last_named = await me.fetch_blocks([block], [*peers[1:], peers[0]])
            assert last_named.per_holder_bytes.keys() == {peers[0]}
            assert stats.requests == 7 + 3  # two LACKING answers, then the holder

    trio.run(main)
