"""Several REQUESTs per ``/cnode/blocks/1.0.0`` stream (specs/blocks.md#interaction): the holder
serves a stream's next REQUEST like its first, and a requester keeps the streams of requests that
ended cleanly for its next request to the same holder (``_fetch/_pool.py``).

Two real nodes on loopback in one process. Streams opened are counted by the requester's pool
(``P2PNode.pool``), which every new stream for a request goes through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from cnode.auth import Identity, issue_access_token
from cnode.node.p2p import (
    FetchError,
    P2PNode,
    P2PSettings,
    PeerAdmission,
    limits,
    open_p2p_node,
)
from cnode.node.p2p._blocks._exchange import request_blocks
from cnode.storage import CID, BlockStore, VerifiedBlock, compute_cid

LOOPBACK = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))


def _blocks(store: BlockStore, n: int, tag: int = 0) -> list[CID]:
    return [store.put_new(bytes([tag, i]) * 3000) for i in range(n)]


@asynccontextmanager
async def _pair(
    tmp_path: Path, holder: BlockStore, settings: P2PSettings = LOOPBACK
) -> AsyncIterator[tuple[P2PNode, str]]:
    """A requester connected to a holder of ``holder``; yields it and the holder's peer id."""
    b_id = Identity.generate()
    async with (
        open_p2p_node(b_id, holder, settings, allow=bool) as b,
        open_p2p_node(Identity.generate(), BlockStore(tmp_path / "a"), LOOPBACK, allow=bool) as a,
    ):
        with trio.fail_after(30):
            await a.connect(b.listen_addrs[0])
            yield a, b_id.peer_id_str


def test_a_holder_serves_several_requests_on_one_stream(tmp_path: Path) -> None:
    holder = BlockStore(tmp_path / "holder")
    cids = _blocks(holder, 6)
    got: list[CID] = []

    async def keep(block: VerifiedBlock) -> None:
        await trio.lowlevel.checkpoint()
        got.append(block.cid)

    async def main() -> None:
        async with _pair(tmp_path, holder) as (a, peer):
            stream = await a._open_stream(peer)
            missing = compute_cid(b"a block nobody holds")
            assert await request_blocks(stream, cids[:2], keep) == set()
            assert await request_blocks(stream, [cids[2], missing], keep) == {missing}
            assert await request_blocks(stream, cids[3:], keep) == set()
            await stream.close()

    trio.run(main)
    assert got == cids  # each verified against its CID on the way in


def test_a_second_fetch_from_the_same_holder_opens_no_new_stream(tmp_path: Path) -> None:
    holder = BlockStore(tmp_path / "holder")
    first, second, third = _blocks(holder, 3)

    async def main() -> None:
        async with _pair(tmp_path, holder) as (a, peer):
            await a.fetch_blocks([first], [peer])
            assert (a.pool.opened, a.pool.reused, len(a.pool)) == (1, 0, 1)
            report = await a.fetch_blocks([second], [peer])
            await a.fetch_blocks([third], [peer])
            assert (a.pool.opened, a.pool.reused, len(a.pool)) == (1, 2, 1)
            assert report.blocks == 1 and report.dropped == {}
            assert a.traffic.exchange.requests == 3

    trio.run(main)


def test_a_pooled_stream_the_holder_closed_is_replaced_and_the_holder_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder closes an idle stream after POOLED_STREAM_IDLE_S (small here, under the
    requester's POOLED_STREAM_MAX_AGE_S): the next request finds it closed, before any answer,
    and is asked again on a new stream; no drop, no stall, no error."""
    monkeypatch.setattr(limits, "POOLED_STREAM_IDLE_S", 0.2)
    holder = BlockStore(tmp_path / "holder")
    cids = _blocks(holder, 2)

    async def main() -> None:
        async with _pair(tmp_path, holder) as (a, peer):
            await a.fetch_blocks(cids[:1], [peer])
            assert len(a.pool) == 1
            await trio.sleep(1.0)  # the holder closed it meanwhile
            report = await a.fetch_blocks(cids[1:], [peer])
            assert report.blocks == 1 and report.dropped == {}
            assert a.pool.replaced == 1 and a.pool.opened == 2
            assert a.traffic.exchange.stalls == 0 and a.traffic.exchange.dropped == {}

    trio.run(main)


def test_a_failed_request_never_gives_its_stream_back(tmp_path: Path) -> None:
    """A holder that sends bad bytes is dropped and its stream reset, not pooled; a holder that
    refuses (ERROR frame) likewise: the next fetch opens a new stream."""
    holder = BlockStore(tmp_path / "holder")
    cids = _blocks(holder, 2)
    corrupt = P2PSettings(listen=LOOPBACK.listen, corrupt_uploads_for_tests=True)

    async def main() -> None:
        async with _pair(tmp_path, holder, corrupt) as (a, peer):
            for cid in cids:
                with pytest.raises(FetchError):
                    await a.fetch_blocks([cid], [peer])
                assert len(a.pool) == 0
            assert (a.pool.opened, a.pool.reused) == (2, 0)
            assert a.traffic.exchange.dropped == {"bad_bytes": 2}

    trio.run(main)


def test_an_abandoned_request_never_gives_its_stream_back(tmp_path: Path) -> None:
    """A request cancelled while its answer is coming (its fetch given up) resets its stream."""
    holder = BlockStore(tmp_path / "holder")
    cids = _blocks(holder, 1)
    slow = P2PSettings(listen=LOOPBACK.listen, busy_for_tests=5.0)

    async def main() -> None:
        async with _pair(tmp_path, holder, slow) as (a, peer):
            with trio.move_on_after(1.0) as scope:
                await a.fetch_blocks(cids, [peer])
            assert scope.cancelled_caught
            assert len(a.pool) == 0 and a.pool.opened == 1

    trio.run(main)


def test_a_token_due_again_is_shown_before_an_idle_stream_is_taken(tmp_path: Path) -> None:
    """In a run, a request on an idle stream first shows the access token when it is due
    (expired at the holder here): without it the holder would refuse the stream's next
    REQUEST (FORBIDDEN) and the fetch would fail."""
    coordinator, holder_id, fetcher_id = (Identity.generate() for _ in range(3))
    now = [1_800_000_000.0]

    def policy(me: Identity) -> PeerAdmission:
        return PeerAdmission(
            coordinator=coordinator.peer_id_str,
            run="run-a",
            credential=lambda: issue_access_token(
                coordinator,
                peer_id=me.peer_id_str,
                username="u",
                run="run-a",
                expires_at=int(now[0]) + 600,
            ),
            clock=lambda: now[0],
        )

    holder = BlockStore(tmp_path / "holder")
    first, second = _blocks(holder, 2)

    async def main() -> None:
        async with (
            open_p2p_node(
                holder_id, holder, LOOPBACK, allow=bool, admission=policy(holder_id)
            ) as b,
            open_p2p_node(
                fetcher_id,
                BlockStore(tmp_path / "a"),
                LOOPBACK,
                allow=bool,
                admission=policy(fetcher_id),
            ) as a,
        ):
            with trio.fail_after(30):
                peer = await a.connect(b.listen_addrs[0])
                await a.fetch_blocks([first], [peer])
                now[0] += 700  # the token shown has expired at the holder
                report = await a.fetch_blocks([second], [peer])
            assert report.blocks == 1 and report.dropped == {}
            assert (a.pool.opened, a.pool.reused) == (1, 1)
            assert a.traffic.exchange.tokens_shown == 2

    trio.run(main)
