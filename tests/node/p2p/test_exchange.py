"""The requesting side of one ``/cnode/blocks/1.0.0`` request (node/p2p/_blocks/_exchange.py)
against in-memory fake holders (tests/node/p2p/fake_holders.py), under a MockClock with worker
threads inline: frames checked against the request, each block's CID seen before its bytes, and the
next block received while the last ones are hashed and kept.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from cnode.node.p2p import BadBlockError, PeerProtocolError, StreamBroken, limits
from cnode.node.p2p._blocks._exchange import request_blocks
from cnode.node.p2p._blocks._wire import Block, End
from cnode.node.p2p._exceptions import first_error
from cnode.storage import CID, VerifiedBlock, compute_cid
from tests.node.p2p.fake_holders import FakeHolder, FakeStream, blocks_of

pytestmark = pytest.mark.usefixtures("threads_inline")


# -- order and early CID -----------------------------------------------------------------------


def test_request_blocks_refuses_out_of_order_blocks() -> None:
    blocks = blocks_of(2)
    a, b = list(blocks)

    class Reversed(FakeStream):
        async def write(self, data: bytes) -> None:
            await super().write(data)
            frames = [Block(b, blocks[b]).encode(), Block(a, blocks[a]).encode(), End().encode()]
            self.steps = collections.deque((0.0, f, None) for f in frames)

    async def main() -> None:
        stream = Reversed(FakeHolder("x", blocks))

        async def keep(_block: VerifiedBlock) -> None:
            await trio.lowlevel.checkpoint()

        with pytest.raises(PeerProtocolError, match="out of request order"):
            await request_blocks(stream, [a, b], keep)

    trio.run(main)


def test_block_start_seen_before_its_bytes() -> None:
    blocks = blocks_of(3, size=4000)
    cids = list(blocks)
    seen: list[tuple[str, CID]] = []

    async def main() -> set[CID]:
        holder = FakeHolder("x", blocks, block_s=1.0, lacks={cids[0]})
        stream = FakeStream(holder)

        async def keep(block: VerifiedBlock) -> None:
            await trio.lowlevel.checkpoint()
            seen.append(("block", block.cid))

        return await request_blocks(
            stream, cids, keep, on_block_start=lambda cid: seen.append(("start", cid))
        )

    lacked = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert lacked == {cids[0]}
    assert seen == [("start", cids[1]), ("block", cids[1]), ("start", cids[2]), ("block", cids[2])]


# -- receiving while keeping ----------------------------------------------------------------


def test_next_block_arrives_while_the_last_is_kept() -> None:
    """The holder is not held up by our disk: while one block is hashed and stored, the next
    one's bytes are read, and RECEIVED_AHEAD blocks are kept side by side."""
    blocks = blocks_of(6, size=4000)
    cids = list(blocks)
    seen: list[tuple[str, CID]] = []
    keep_s = 5.0  # virtual seconds to store one block: far slower than the holder sends

    async def main() -> float:
        stream = FakeStream(FakeHolder("x", blocks, block_s=0.1))

        async def keep(block: VerifiedBlock) -> None:
            await trio.sleep(keep_s)
            seen.append(("kept", block.cid))

        start = trio.current_time()
        assert (
            await request_blocks(
                stream, cids, keep, on_block_start=lambda cid: seen.append(("start", cid))
            )
            == set()
        )
        return trio.current_time() - start

    seconds = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    kept = [str(c) for kind, c in seen if kind == "kept"]
    assert sorted(kept) == sorted(map(str, cids))  # every block handed on, once
    assert seen.index(("start", cids[1])) < seen.index(("kept", cids[0]))
    assert seconds == pytest.approx(len(cids) * keep_s / limits.RECEIVED_AHEAD, abs=1.0)


def _answer_then_break(blocks: dict[CID, bytes], frames: list[bytes]) -> FakeStream:
    class Breaks(FakeStream):
        async def write(self, data: bytes) -> None:
            await super().write(data)
            self.steps = collections.deque((0.0, f, None) for f in frames)

        async def read(self, max_bytes: int) -> bytes:
            if not self.steps and not self.buffer:
                raise StreamBroken("the holder went away")
            return await super().read(max_bytes)

    return Breaks(FakeHolder("x", blocks))


def test_blocks_that_arrived_before_a_fault_are_still_kept() -> None:
    blocks = blocks_of(3)
    a, b, c = list(blocks)
    kept: list[CID] = []
    stream = _answer_then_break(
        blocks, [Block(a, blocks[a]).encode(), Block(b, blocks[b]).encode()]
    )

    async def main() -> None:
        async def keep(block: VerifiedBlock) -> None:
            await trio.sleep(1.0)
            kept.append(block.cid)

        with pytest.raises(StreamBroken, match="went away"):
            await request_blocks(stream, [a, b, c], keep)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # Received whole before the stream broke: not thrown away (kept side by side, in any order).
    assert sorted(map(str, kept)) == sorted(map(str, [a, b]))


def test_a_bad_block_behind_good_ones_ends_the_request_with_the_evidence() -> None:
    blocks = blocks_of(3)
    a, b, c = list(blocks)
    forged = bytes([blocks[b][0] ^ 0xFF]) + blocks[b][1:]
    frames = [Block(a, blocks[a]).encode(), Block(b, forged).encode(), Block(c, blocks[c]).encode()]
    stream = _answer_then_break(blocks, [*frames, End().encode()])
    kept: list[CID] = []

    async def main() -> None:
        async def keep(block: VerifiedBlock) -> None:
            await trio.sleep(1.0)
            kept.append(block.cid)

        with pytest.raises(BadBlockError) as info:
            await request_blocks(stream, [a, b, c], keep)
        assert info.value.claimed == str(b)
        assert info.value.computed == str(compute_cid(forged))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert b not in kept


def test_a_holder_that_corrupts_every_block_fails_the_request_with_one_bad_block_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks are checked side by side, so a holder that corrupts them all fails several checks
    at once; the request still ends with one BadBlockError (the scheduler drops the holder on
    it), never an ExceptionGroup that nobody expects."""
    T = TypeVar("T")

    async def slow_hash(fn: Callable[..., T], *args: Any, **_kwargs: Any) -> T:
        # Every check takes as long, and like a worker thread it cannot be cancelled midway:
        # the checks started together all finish, and all fail.
        with trio.CancelScope(shield=True):
            await trio.sleep(1.0)
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", slow_hash)
    blocks = blocks_of(4)
    cids = list(blocks)
    stream = FakeStream(FakeHolder("bad", blocks, corrupt=True))

    async def main() -> None:
        with pytest.raises(BadBlockError) as info:
            await request_blocks(stream, cids, _never_kept)
        assert info.value.claimed in {str(c) for c in cids[: limits.RECEIVED_AHEAD]}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def _never_kept(block: VerifiedBlock) -> None:
    raise AssertionError(f"a bad block was handed on: {block}")


def test_first_error_picks_the_evidence_and_unwraps() -> None:
    bad = [
        BadBlockError("x", claimed="a", computed="b"),
        BadBlockError("y", claimed="c", computed="d"),
    ]
    broken = StreamBroken("gone")
    assert first_error(ExceptionGroup("g", bad)) is bad[0]
    assert (
        first_error(ExceptionGroup("g", [broken, ExceptionGroup("h", [bad[1]])]), BadBlockError)
        is bad[1]
    )
    assert first_error(ExceptionGroup("g", [broken])) is broken
