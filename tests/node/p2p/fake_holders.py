"""In-memory holders of ``/cnode/blocks/1.0.0`` for the exchange and scheduler tests.

Each fake holder answers requests with real frames from ``_wire.py``, block by block in request
order as specs/blocks.md says, and can be silent, lack blocks, be slow (each block sent in
PIECES pieces, a sleep before each) or flip bytes. Tests run them under
``trio.testing.MockClock(autojump_threshold=0)`` with worker threads inline (the
``threads_inline`` fixture of this folder's conftest), so the mock clock cannot jump while a
CID check or a store write works.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from cnode.node.p2p import StreamBroken
from cnode.node.p2p._blocks._wire import Block, End, Lacking, Request
from cnode.node.p2p._fetch._fetch_types import RequestStream
from cnode.storage import CID, BlockStore, UnsyncedBatch, VerifiedBlock, compute_cid

PIECES = 4


def blocks_of(n: int, size: int = 1000) -> dict[CID, bytes]:
    out = {}
    for i in range(n):
        data = struct.pack(">I", i) * (size // 4)
        out[compute_cid(data)] = data
    return out


class CountingStore(BlockStore):
    """A BlockStore that counts every put per CID (the exchange puts verified blocks)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: collections.Counter[CID] = collections.Counter()
        self.hashing_puts = 0  # puts that hash again (put); the exchange makes none

    def put(self, cid: CID, data: bytes | bytearray | memoryview) -> None:
        self.puts[cid] += 1
        self.hashing_puts += 1
        super().put(cid, data)

    def put_verified(self, block: VerifiedBlock, *, batch: UnsyncedBatch | None = None) -> None:
        self.puts[block.cid] += 1
        super().put_verified(block, batch=batch)

    def get(self, cid: CID) -> bytes:
        self.gets += 1
        return super().get(cid)

    gets = 0  # blocks read back out of the store


@dataclass
class FakeHolder:
    """An in-memory holder. ``sent`` counts BLOCK frames whose last byte was read."""

    peer: str
    blocks: dict[CID, bytes]
    block_s: float = 0.0  # virtual seconds to send one block
    silent: bool = False  # reads the request, never answers
    busy_until: float = 0.0  # sends nothing before this (virtual) time: starved, not dead
    corrupt: bool = False  # flips the first byte of every block
    lacks: set[CID] = field(default_factory=set)
    lack_in_first: tuple[int, ...] = ()  # also lacks these positions of its first request
    requests: list[tuple[CID, ...]] = field(default_factory=list)
    sent: collections.Counter[CID] = field(default_factory=collections.Counter)
    bad_sent: collections.Counter[CID] = field(default_factory=collections.Counter)
    open_now: int = 0
    max_open: int = 0

    def answer(self, cids: tuple[CID, ...]) -> list[tuple[float, bytes, CID | None]]:
        """The steps of one answer: (sleep before, bytes, CID whose last byte this is)."""
        if len(self.requests) == 1:
            self.lacks |= {cids[i] for i in self.lack_in_first}
        steps: list[tuple[float, bytes, CID | None]] = []
        lacking = []
        for cid in cids:
            if cid in self.lacks or cid not in self.blocks:
                lacking.append(cid)
                continue
            data = self.blocks[cid]
            if self.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            frame = Block(cid, data).encode()
            step = -(-len(frame) // PIECES)
            for start in range(0, len(frame), step):
                last = start + step >= len(frame)
                steps.append(
                    (self.block_s / PIECES, frame[start : start + step], cid if last else None)
                )
        if lacking:
            steps.append((0.0, Lacking(tuple(lacking)).encode(), None))
        steps.append((0.0, End().encode(), None))
        return steps


class FakeStream:
    """One request stream to a FakeHolder (read, write, close, reset)."""

    def __init__(self, holder: FakeHolder) -> None:
        self.holder = holder
        self.steps: collections.deque[tuple[float, bytes, CID | None]] = collections.deque()
        self.buffer = b""
        self.finished = False
        self.was_reset = False

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        request = Request.decode(data[5:])
        self.holder.requests.append(request.cids)
        self.holder.open_now += 1
        self.holder.max_open = max(self.holder.max_open, self.holder.open_now)
        self.steps.extend(self.holder.answer(request.cids))

    async def read(self, max_bytes: int) -> bytes:
        if self.was_reset:
            raise StreamBroken("reset")
        if self.holder.silent:
            await trio.sleep_forever()
        await trio.sleep_until(self.holder.busy_until)
        if not self.buffer:
            if not self.steps:
                await trio.lowlevel.checkpoint()
                return b""
            delay, data, done = self.steps[0]
            await trio.sleep(delay)
            self.steps.popleft()
            self.buffer = data
            if done is not None:
                (self.holder.bad_sent if self.holder.corrupt else self.holder.sent)[done] += 1
        out, self.buffer = self.buffer[:max_bytes], self.buffer[max_bytes:]
        return out

    def _end(self) -> None:
        if not self.finished:
            self.finished = True
            self.holder.open_now -= 1

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()
        self._end()

    async def reset(self) -> None:
        self.was_reset = True
        self._end()


def opener(holders: list[FakeHolder]) -> Callable[[str], Awaitable[RequestStream]]:
    by_peer = {h.peer: h for h in holders}

    async def open_stream(peer: str) -> RequestStream:
        await trio.lowlevel.checkpoint()
        return FakeStream(by_peer[peer])

    return open_stream
