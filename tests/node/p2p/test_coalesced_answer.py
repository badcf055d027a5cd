"""A holder answers a small request in one write (specs/blocks.md#interaction, 6; issue 41).

At 32 members a round's requests carry one or two blocks of a few KB, and each stream write cost
both ends a yamux frame and a Noise message in Python. An uncapped holder now writes an answer
that fits COALESCED_ANSWER_BYTES at once. What it writes must be byte for byte the answer it
streams otherwise: the same BLOCK frames in request order, LACKING, END. These tests compare
the two on the real ``BlockServer`` and read the answer back with the real requester
(``request_blocks``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from cnode.node.p2p import limits
from cnode.node.p2p._blocks._exchange import request_blocks
from cnode.node.p2p._blocks._server import BlockServer
from cnode.node.p2p._blocks._wire import Request
from cnode.node.p2p._bucket import TokenBucket
from cnode.storage import CID, BlockStore, VerifiedBlock, compute_cid


class _Requester:
    """The holder's side of one request stream: reads the REQUEST, keeps each write apart."""

    peer = "requester-peer-id"

    def __init__(self, cids: list[CID]) -> None:
        self.pending = Request(tuple(cids)).encode()
        self.writes: list[bytes] = []

    async def read(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint()
        out, self.pending = self.pending[:max_bytes], self.pending[max_bytes:]
        return out

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.writes.append(bytes(data))


class _Answer:
    """The requester's side: the REQUEST it writes is dropped, the holder's bytes are read."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()

    async def read(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint()
        out, self.data = self.data[:max_bytes], self.data[max_bytes:]
        return out


def _served(store: BlockStore, cids: list[CID], rate: float = 0.0) -> list[bytes]:
    stream = _Requester(cids)

    async def main() -> None:
        server = BlockServer(store, allow=bool, bucket=TokenBucket(rate))  # its clock is trio's
        assert await server._serve(stream, stream.peer, trio.current_time())  # type: ignore[arg-type]

    trio.run(main)
    return stream.writes


def _read_back(cids: list[CID], answer: bytes) -> tuple[list[CID], set[CID]]:
    got: list[CID] = []

    async def keep(block: VerifiedBlock) -> None:
        got.append(block.cid)

    async def main() -> set[CID]:
        return await request_blocks(_Answer(answer), cids, keep)

    return got, trio.run(main)


def test_a_small_answer_is_one_write_with_the_bytes_of_the_streamed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlockStore(tmp_path / "holder")
    a, c = store.put_new(b"a" * 6500), store.put_new(b"c" * 700)
    missing = compute_cid(b"a block nobody holds")
    cids = [a, missing, c]

    at_once = _served(store, cids)
    monkeypatch.setattr(limits, "COALESCED_ANSWER_BYTES", 0)
    streamed = _served(store, cids)

    assert len(at_once) == 1
    assert len(streamed) == 4  # BLOCK a, BLOCK c, LACKING, END
    assert at_once[0] == b"".join(streamed)
    got, lacking = _read_back(cids, at_once[0])
    assert got == [a, c]
    assert lacking == {missing}


def test_an_answer_over_the_limit_is_streamed_block_by_block(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "holder")
    big = store.put_new(b"b" * limits.COALESCED_ANSWER_BYTES)  # with its framing, over it
    small = store.put_new(b"s" * 100)

    writes = _served(store, [small, big])

    assert len(writes) == 3  # BLOCK small, BLOCK big, END
    got, lacking = _read_back([small, big], b"".join(writes))
    assert got == [small, big]
    assert lacking == set()


def test_a_capped_holder_streams_even_a_small_answer(tmp_path: Path) -> None:
    """The upload token bucket paces every piece it sends, so a capped holder keeps writing
    frame by frame."""
    store = BlockStore(tmp_path / "holder")
    cids = [store.put_new(bytes([i]) * 500) for i in range(2)]

    writes = _served(store, cids, rate=10_000_000)

    assert len(writes) == 3  # BLOCK, BLOCK, END
    got, _ = _read_back(cids, b"".join(writes))
    assert got == cids


def test_a_block_corrupt_on_disk_is_answered_lacking_in_one_write(tmp_path: Path) -> None:
    """The store verifies what it reads: a block whose file was damaged is not sent (and is
    quarantined), the rest of the answer still goes at once."""
    store = BlockStore(tmp_path / "holder")
    good, bad = store.put_new(b"g" * 900), store.put_new(b"d" * 900)
    path = store._files.path(bad)
    path.write_bytes(b"x" * 900)

    writes = _served(store, [good, bad])

    assert len(writes) == 1
    got, lacking = _read_back([good, bad], writes[0])
    assert got == [good]
    assert lacking == {bad}
    assert store.get(good) == b"g" * 900  # what was stored and sound is untouched
