"""Requesting side of ``/cnode/blocks/1.0.0`` (specs/blocks.md#interaction): one request (on a
new stream or on one whose earlier requests ended cleanly).

:func:`request_blocks` sends one REQUEST and reads the answer, checking every frame against the
request. Each BLOCK's CID is recomputed from its bytes *before* the block is handed on, once
(``cnode.storage.verify_received``): the caller gets a ``VerifiedBlock`` that the store writes
without hashing again (``BlockStore.put_verified``); a mismatch raises BadBlockError with the
evidence. Peer choice and retries are not here (see
_scheduler.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import trio

from cnode.storage import (
    CID,
    BlockMismatchError,
    BlockTooLargeError,
    VerifiedBlock,
    verify_received,
)

from .. import limits
from .._exceptions import BadBlockError, PeerProtocolError, RemoteRefusedError, first_error
from ._wire import Block, ByteStream, End, Error, FrameReader, Lacking, Request

OnBlock = Callable[[VerifiedBlock], Awaitable[None]]


def _checked(claimed: CID, data: bytes) -> VerifiedBlock:
    try:
        return verify_received(claimed, bytes(data))
    except BlockTooLargeError as exc:
        raise PeerProtocolError(f"block {claimed} is over MAX_BLOCK_SIZE") from exc
    except BlockMismatchError as exc:
        raise BadBlockError(
            f"bytes sent for {claimed} hash to {exc.computed}",
            claimed=str(claimed),
            computed=str(exc.computed),
        ) from exc


async def request_blocks(
    stream: ByteStream,
    cids: Sequence[CID],
    on_block: OnBlock,
    on_frame: Callable[[], None] = lambda: None,
    on_block_start: Callable[[CID], None] = lambda _cid: None,
    on_block_arrived: Callable[[CID], None] = lambda _cid: None,
) -> set[CID]:
    """Ask for ``cids`` on ``stream``; call ``on_block`` for each verified block; return lacks.

    Args:
        stream: a stream to the holder, negotiated to PROTOCOL_ID: fresh, or one whose
            earlier requests all ended with their END.
        cids: 1 to MAX_REQUEST_CIDS distinct CIDs.
        on_block: awaited with a VerifiedBlock once the bytes are proven to hash to the CID.
        on_frame: called on every frame (the scheduler's no-progress timer).
        on_block_start: called with a BLOCK's CID as soon as its header has arrived, before
            its bytes. Blocks come in request order, so every CID requested before it and not
            answered is one the holder lacks. What it raises ends the request.
        on_block_arrived: called with a BLOCK's CID once its bytes have arrived whole, before
            they are hashed (the next block may then arrive while this one is kept).

    Returns: the CIDs the holder said it lacks.

    Error handling: BadBlockError (bytes do not match), PeerProtocolError (bad or unexpected
    frames, a block out of request order, early end), RemoteRefusedError (ERROR frame),
    StreamBroken (from the stream). The caller closes or resets the stream.
    """
    if not 0 < len(cids) <= limits.MAX_REQUEST_CIDS:
        raise ValueError(f"a request names 1 to {limits.MAX_REQUEST_CIDS} CIDs")
    await stream.write(Request(tuple(cids)).encode())
    # Receiving and keeping run side by side: the next block's bytes arrive while the last one
    # is hashed and stored, so the holder never waits on our disk (at most RECEIVED_AHEAD
    # blocks wait in memory per request). A bad block ends the request at once; any other
    # fault ends it once the blocks that arrived whole before it are checked and kept.
    lacking: set[CID] = set()
    fault: Exception | None = None
    try:
        async with trio.open_nursery() as nursery:
            keeper = _Keeper(nursery, on_block)
            try:
                lacking = await _read_answer(
                    stream, cids, keeper.keep, on_frame, on_block_start, on_block_arrived
                )
            # Held, not swallowed: re-raised below once the keeper has checked and stored the
            # blocks that arrived whole before the fault (a bad block still goes first).
            except Exception as exc:
                fault = exc
    except BaseExceptionGroup as group:
        raise first_error(group, BadBlockError) from None  # the evidence goes first
    if fault is not None:
        raise fault
    return lacking


class _Keeper:
    """Checks and hands on the blocks of one request, up to RECEIVED_AHEAD at once, each in
    its own task (the hash of a block over INLINE_BLOCK_BYTES and the store's write run in
    worker threads, side by side; a smaller block is hashed on the loop, cheaper than a hop)."""

    def __init__(self, nursery: trio.Nursery, on_block: OnBlock) -> None:
        self._nursery = nursery
        self._on_block = on_block
        self._slots = trio.Semaphore(limits.RECEIVED_AHEAD)

    async def keep(self, frame: Block) -> None:
        """Start keeping ``frame`` (waits while RECEIVED_AHEAD blocks are being kept)."""
        await self._slots.acquire()
        self._nursery.start_soon(self._keep, frame)

    async def _keep(self, frame: Block) -> None:
        try:
            if len(frame.data) <= limits.INLINE_BLOCK_BYTES:
                block = _checked(frame.cid, frame.data)
            else:
                block = await trio.to_thread.run_sync(_checked, frame.cid, frame.data)
            await self._on_block(block)
        finally:
            self._slots.release()


async def _read_answer(
    stream: ByteStream,
    cids: Sequence[CID],
    keep: Callable[[Block], Awaitable[None]],
    on_frame: Callable[[], None],
    on_block_start: Callable[[CID], None],
    on_block_arrived: Callable[[CID], None],
) -> set[CID]:
    unanswered = set(cids)
    order = {cid: i for i, cid in enumerate(cids)}
    last = -1  # request index of the latest BLOCK
    lacking: set[CID] = set()
    reader = FrameReader(stream)

    def started(cid: CID) -> None:
        nonlocal last
        if cid not in unanswered:
            raise PeerProtocolError(f"unrequested or repeated block {cid}")
        if order[cid] < last:
            raise PeerProtocolError(f"block {cid} out of request order")
        last = order[cid]
        on_block_start(cid)

    while True:
        frame = await reader.read_frame(limits.MAX_FRAME_BODY, started)
        on_frame()
        if frame is None:
            raise PeerProtocolError(f"stream ended with {len(unanswered)} CIDs unanswered")
        if isinstance(frame, Block):
            if frame.cid not in unanswered:
                raise PeerProtocolError(f"unrequested or repeated block {frame.cid}")
            unanswered.discard(frame.cid)
            on_block_arrived(frame.cid)
            await keep(frame)
        elif isinstance(frame, Lacking):
            if not set(frame.cids) <= unanswered:
                raise PeerProtocolError("LACKING names CIDs not requested or already answered")
            unanswered -= set(frame.cids)
            lacking |= set(frame.cids)
        elif isinstance(frame, End):
            if unanswered:
                raise PeerProtocolError(f"END with {len(unanswered)} CIDs unanswered")
            return lacking
        elif isinstance(frame, Error):
            raise RemoteRefusedError(
                f"holder refused: {frame.status.name}: {frame.text}", int(frame.status)
            )
        else:
            raise PeerProtocolError(f"unexpected {type(frame).__name__} frame from holder")


class Resettable(Protocol):
    async def close(self) -> None: ...
    async def reset(self) -> None: ...


async def request_then_close(
    stream: Resettable,
    counted: ByteStream,
    cids: Sequence[CID],
    on_block: OnBlock,
    on_frame: Callable[[], None],
    on_block_start: Callable[[CID], None],
    on_block_arrived: Callable[[CID], None],
    pooled: Callable[[], bool] = lambda: False,
) -> set[CID]:
    """:func:`request_blocks` on ``counted`` (``stream`` as read through a byte counter), then
    ``stream`` closed unless ``pooled()`` kept it for a next request (the answer's END read);
    reset instead on any error or cancellation (bounded, shielded), so the holder stops sending
    and the stream is never used again."""
    try:
        lacked = await request_blocks(
            counted, cids, on_block, on_frame, on_block_start, on_block_arrived
        )
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.reset()
        raise
    if not pooled():
        await stream.close()
    return lacked
