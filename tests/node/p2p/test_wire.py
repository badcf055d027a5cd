"""Frames of /cnode/blocks/1.0.0: one encode and one decode per message, bounds enforced."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from cnode.node.p2p import FrameTooLargeError, PeerProtocolError, limits
from cnode.node.p2p._blocks._wire import (
    Block,
    End,
    Error,
    FrameKind,
    FrameReader,
    Lacking,
    Request,
    Status,
    decode_frame,
)
from cnode.storage import compute_cid


class _Bytes:
    """A ByteStream over fixed bytes, returning them in small reads."""

    def __init__(self, data: bytes, step: int = 7) -> None:
        self.data, self.pos, self.step = data, 0, step

    async def read(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint()
        n = min(max_bytes, self.step)
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    async def write(self, data: bytes) -> None:
        raise AssertionError("read-only")

    async def close(self) -> None:
        pass


CIDS = tuple(compute_cid(bytes([i]) * 10) for i in range(3))


@pytest.mark.parametrize(
    "message",
    [
        Request(CIDS),
        Block(CIDS[0], b"\x00" * 10),
        Lacking(CIDS[1:]),
        End(),
        Error(Status.FORBIDDEN, "not allowed"),
    ],
)
def test_round_trip(message: object) -> None:
    async def main() -> None:
        reader = FrameReader(_Bytes(message.encode() * 2))  # type: ignore[attr-defined]
        assert await reader.read_frame(limits.MAX_FRAME_BODY) == message
        assert await reader.read_frame(limits.MAX_FRAME_BODY) == message
        assert await reader.read_frame(limits.MAX_FRAME_BODY) is None

    trio.run(main)


def test_block_header_is_the_encode_path() -> None:
    block = Block(CIDS[0], b"abc")
    assert block.encode() == Block.header(CIDS[0], 3) + b"abc"


def test_oversized_frame_refused_before_reading_body() -> None:
    header = struct.pack(">BI", FrameKind.BLOCK, limits.MAX_FRAME_BODY + 1)

    async def main() -> None:
        with pytest.raises(FrameTooLargeError, match="exceeds the limit"):
            await FrameReader(_Bytes(header)).read_frame(limits.MAX_FRAME_BODY)

    trio.run(main)


def test_too_many_cids() -> None:
    body = struct.pack(">H", limits.MAX_REQUEST_CIDS + 1)
    with pytest.raises(FrameTooLargeError, match="MAX_REQUEST_CIDS"):
        decode_frame(FrameKind.REQUEST, body)


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        (99, b"", "unknown frame kind"),
        (FrameKind.REQUEST, b"\x00\x00", "no CIDs"),
        (FrameKind.REQUEST, b"\x00\x01\x05abcde", "bad CID"),
        (FrameKind.REQUEST, b"\x00\x01\xff", "bad CID length"),
        (FrameKind.REQUEST, Request(CIDS).encode()[5:] + b"x", "trailing"),
        (FrameKind.END, b"x", "must be empty"),
        (FrameKind.ERROR, b"\x63hi", "unknown status"),
        (FrameKind.BLOCK, b"", "empty"),
    ],
)
def test_malformed_frames(kind: int, body: bytes, message: str) -> None:
    with pytest.raises(PeerProtocolError, match=message):
        decode_frame(kind, body)


def test_truncated_stream() -> None:
    data = Block(CIDS[0], b"x" * 100).encode()[:-1]

    async def main() -> None:
        with pytest.raises(PeerProtocolError, match="ended inside a frame"):
            await FrameReader(_Bytes(data)).read_frame(limits.MAX_FRAME_BODY)

    trio.run(main)


@pytest.mark.parametrize("step", [1, 7, 40, 4096, 1 << 20])
def test_blocks_read_in_any_pieces_are_the_blocks_sent(step: int) -> None:
    """FrameReader joins a BLOCK body once from the pieces read (_read_block), whatever their
    sizes: the CID split across reads, frames sharing a read, the next frame in the last read."""
    # Byte by byte, megabyte blocks take half a minute and show nothing small ones do not.
    sizes = [1, 300_000, 70_000, 1 << 20] if step > 1 else [1, 3_000, 700, 10_000]
    blocks = [Block(compute_cid(bytes([i]) * n), bytes([i]) * n) for i, n in enumerate(sizes)]
    wire = b"".join(b.encode() for b in blocks) + End().encode()

    async def main() -> None:
        reader = FrameReader(_Bytes(wire, step), read_size=4096)
        seen: list[object] = []
        for _ in range(len(blocks) + 1):
            seen.append(await reader.read_frame(limits.MAX_FRAME_BODY, seen.append))
        assert await reader.read_frame(limits.MAX_FRAME_BODY) is None
        frames = [f for f in seen if isinstance(f, (Block, End))]
        assert frames == [*blocks, End()]
        assert [c for c in seen if not isinstance(c, (Block, End))] == [b.cid for b in blocks]

    trio.run(main)


def test_stream_ending_inside_a_block_body_is_a_protocol_error() -> None:
    data = Block(CIDS[0], b"x" * 300_000).encode()[:-1]

    async def main() -> None:
        with pytest.raises(PeerProtocolError, match="ended inside a frame"):
            await FrameReader(_Bytes(data, 65536)).read_frame(limits.MAX_FRAME_BODY)

    trio.run(main)


def test_token_bucket_rate() -> None:
    from cnode.node.p2p import TokenBucket

    async def main() -> None:
        bucket = TokenBucket(1_000_000, burst=100_000)
        start = trio.current_time()
        for _ in range(30):
            await bucket.take(100_000)
        elapsed = trio.current_time() - start
        # 3 MB at 1 MB/s after a 0.1 MB burst: 2.9 s of virtual time.
        assert 2.8 <= elapsed <= 3.0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
