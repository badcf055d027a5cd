"""The holder's side when a REQUEST is late (node/p2p/_blocks/_server.py), under a MockClock.

Issue 41: at 12 members a requester's REQUEST waited behind its own block data on the
connection for over 10 s; the holder answered BAD_REQUEST ("no request within timeout") and the
requester dropped it as if it had refused. Now the holder waits REQUEST_READ_TIMEOUT_S and
answers BUSY, which the requester takes as backpressure (its request goes back to the queue,
the holder is kept).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from cnode.node.p2p import FetchReport, limits
from cnode.node.p2p._blocks._server import BlockServer
from cnode.node.p2p._blocks._wire import Block, End, Error, FrameReader, Request, Status
from cnode.node.p2p._bucket import TokenBucket
from cnode.node.p2p._fetch._scheduler import Transfer
from cnode.storage import BlockStore
from tests.node.p2p.fake_holders import blocks_of

pytestmark = pytest.mark.usefixtures("threads_inline")


class _SilentRequester:
    """A stream whose requester never sends its REQUEST; what the holder writes is kept."""

    peer = "requester-peer-id"

    def __init__(self) -> None:
        self.written = b""

    async def read(self, max_bytes: int) -> bytes:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def write(self, data: bytes) -> None:
        self.written += data


class _Written:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, max_bytes: int) -> bytes:
        out, self.data = self.data[:max_bytes], self.data[max_bytes:]
        return out


def test_a_late_request_is_answered_busy_after_the_read_timeout(tmp_path: Path) -> None:
    server = BlockServer(BlockStore(tmp_path / "s"), allow=bool, bucket=TokenBucket(0))
    stream = _SilentRequester()

    async def main() -> tuple[float, object]:
        start = trio.current_time()
        await server._serve(stream, stream.peer, start)  # type: ignore[arg-type]
        took = trio.current_time() - start
        return took, await FrameReader(_Written(stream.written)).read_frame(1024)

    took, frame = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert took == limits.REQUEST_READ_TIMEOUT_S
    assert isinstance(frame, Error)
    assert frame.status == Status.BUSY
    assert "REQUEST_READ_TIMEOUT_S" in frame.text


def test_a_busy_answer_keeps_the_holder(tmp_path: Path) -> None:
    """The requester's side of the same answer: backpressure, not a refusal."""
    blocks = blocks_of(2)
    answers = [Error(Status.BUSY, "no REQUEST within REQUEST_READ_TIMEOUT_S (30 s)").encode()]

    class _Once:
        """Answers BUSY to the first request, then holds the blocks it is asked for."""

        def __init__(self) -> None:
            self.out = b""

        async def write(self, data: bytes) -> None:
            cids = Request.decode(data[5:]).cids
            if answers:
                self.out = answers.pop()
            else:
                self.out = b"".join(Block(c, blocks[c]).encode() for c in cids) + End().encode()

        async def read(self, max_bytes: int) -> bytes:
            await trio.lowlevel.checkpoint()
            out, self.out = self.out[:max_bytes], self.out[max_bytes:]
            return out

        async def close(self) -> None:
            await trio.lowlevel.checkpoint()

        async def reset(self) -> None:
            await trio.lowlevel.checkpoint()

    async def open_stream(peer: str) -> _Once:
        return _Once()

    async def main() -> FetchReport:
        store = BlockStore(tmp_path / "c")
        transfer = Transfer(store, open_stream, ["holder"])  # type: ignore[arg-type]
        with trio.fail_after(60):
            await transfer.fetch(list(blocks))
        return transfer.report(next(iter(blocks)))

    report = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert report.blocks == len(blocks)
    assert report.dropped == {}
