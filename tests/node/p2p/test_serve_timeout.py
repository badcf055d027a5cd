"""Timeouts of a busy holder, not a dead one (issue 41), under a MockClock: a REQUEST late at the
holder (node/p2p/_blocks/_server.py), a stream whose protocol selection times out (_node.py).

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
from libp2p.host.exceptions import StreamFailure
from libp2p.protocol_muxer.exceptions import MultiselectClientError

from cnode.node.p2p import FetchReport, limits
from cnode.node.p2p._blocks._admission import PeerAdmission, serve_admit
from cnode.node.p2p._blocks._server import BlockServer
from cnode.node.p2p._blocks._stream import selection_timed_out
from cnode.node.p2p._blocks._wire import Block, End, Error, FrameReader, Request, Status
from cnode.node.p2p._bucket import TokenBucket
from cnode.node.p2p._exceptions import StreamOpenTimeout
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


def test_a_stream_that_times_out_opening_is_given_back_and_the_holder_kept(
    tmp_path: Path,
) -> None:
    """A holder whose connection is up but which did not answer a stream's protocol selection
    in time is busy, not unreachable (issue 41: 384 such drops at 16 members): the request
    goes back to the queue and is asked again; the holder is not dropped."""
    blocks = blocks_of(3)
    failures = [StreamOpenTimeout("cannot open a stream to holder (protocol selection timed out)")]
    stores: list[BlockStore] = []

    class _Serving:
        def __init__(self) -> None:
            self.out = b""

        async def write(self, data: bytes) -> None:
            cids = Request.decode(data[5:]).cids
            self.out = b"".join(Block(c, blocks[c]).encode() for c in cids) + End().encode()

        async def read(self, max_bytes: int) -> bytes:
            await trio.lowlevel.checkpoint()
            out, self.out = self.out[:max_bytes], self.out[max_bytes:]
            return out

        async def close(self) -> None:
            await trio.lowlevel.checkpoint()

        async def reset(self) -> None:
            await trio.lowlevel.checkpoint()

    async def open_stream(peer: str) -> _Serving:
        await trio.sleep(1)
        if failures:
            raise failures.pop()
        return _Serving()

    async def main() -> tuple[FetchReport, int]:
        stores.append(BlockStore(tmp_path / "c"))
        transfer = Transfer(stores[0], open_stream, ["holder"])  # type: ignore[arg-type]
        with trio.fail_after(60):
            await transfer.fetch(list(blocks))
        return transfer.report(next(iter(blocks))), transfer.stats.stalls

    report, stalls = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert report.blocks == len(blocks)
    assert report.dropped == {}
    assert stalls == 1


def test_only_a_timed_out_protocol_selection_counts_as_busy() -> None:
    timed_out = MultiselectClientError("response timed out after 30s, protocols tried: [x]")
    outer = StreamFailure("failed to open a stream to peer X")
    outer.__cause__ = timed_out
    assert selection_timed_out(outer)
    refused = StreamFailure("failed to open a stream to peer X")
    refused.__cause__ = MultiselectClientError("protocols not supported: tried ['x']")
    assert not selection_timed_out(refused)
    assert not selection_timed_out(StreamFailure("no connection"))


def test_a_late_access_token_is_answered_busy_after_the_admit_timeout() -> None:
    """The same at admission: an ADMIT that has not arrived in ADMIT_TIMEOUT_S is BUSY (the
    requester gives its request back and keeps the holder), not BAD_REQUEST (a refusal)."""
    admission = PeerAdmission(coordinator="coordinator", run="r", credential=lambda: None)
    stream = _SilentRequester()

    async def main() -> tuple[float, bool, object]:
        start = trio.current_time()
        admitted = await serve_admit(stream, stream.peer, admission)  # type: ignore[arg-type]
        took = trio.current_time() - start
        return took, admitted, await FrameReader(_Written(stream.written)).read_frame(1024)

    took, admitted, frame = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert took == limits.ADMIT_TIMEOUT_S
    assert not admitted
    assert isinstance(frame, Error) and frame.status == Status.BUSY
    assert "ADMIT_TIMEOUT_S" in frame.text
