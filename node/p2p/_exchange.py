"""Requesting side of ``/cnode/blocks/1.0.0`` (specs/blocks.md#interaction): one request.

:func:`request_blocks` sends one REQUEST and reads the answer, checking every frame against the
request. Each BLOCK's CID is recomputed from its bytes *before* the block is handed on, once
(``cnode.storage.verify_received``): the caller gets a ``VerifiedBlock`` that the store writes
without hashing again (``BlockStore.put_verified``); a mismatch raises BadBlockError with the
evidence. Peer choice and retries are not here (see
_scheduler.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from cnode.storage import (
    CID,
    BlockMismatchError,
    BlockTooLargeError,
    VerifiedBlock,
    verify_received,
)

from . import limits
from ._exceptions import BadBlockError, PeerProtocolError, RemoteRefusedError
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
) -> set[CID]:
    """Ask for ``cids`` on ``stream``; call ``on_block`` for each verified block; return lacks.

    Args:
        stream: a fresh stream to the holder, negotiated to PROTOCOL_ID.
        cids: 1 to MAX_REQUEST_CIDS distinct CIDs.
        on_block: awaited with a VerifiedBlock once the bytes are proven to hash to the CID.
        on_frame: called on every frame (the scheduler's no-progress timer).
        on_block_start: called with a BLOCK's CID as soon as its header has arrived, before
            its bytes. Blocks come in request order, so every CID requested before it and not
            answered is one the holder lacks. What it raises ends the request.

    Returns: the CIDs the holder said it lacks.

    Error handling: BadBlockError (bytes do not match), PeerProtocolError (bad or unexpected
    frames, a block out of request order, early end), RemoteRefusedError (ERROR frame),
    StreamBroken (from the stream). The caller closes or resets the stream.
    """
    if not 0 < len(cids) <= limits.MAX_REQUEST_CIDS:
        raise ValueError(f"a request names 1 to {limits.MAX_REQUEST_CIDS} CIDs")
    await stream.write(Request(tuple(cids)).encode())
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
            block = await trio.to_thread.run_sync(_checked, frame.cid, frame.data)
            unanswered.discard(frame.cid)
            await on_block(block)
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
