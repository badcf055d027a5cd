"""Serving side of ``/cnode/blocks/1.0.0`` (specs/blocks.md#interaction): parse, check, answer.

Several requests per stream, one after another. The handler decodes the REQUEST, checks the
requester against the allow hook and the per-peer stream cap, then streams BLOCK frames for held
blocks (each read from disk and verified by the store while the one before it is sent, sent in
SEND_PIECE pieces through the upload token bucket, or in one write when the node's upload is
uncapped), one LACKING frame for the rest, and END; an uncapped holder writes an answer that
fits COALESCED_ANSWER_BYTES (most of a round's) at once instead, the same frames. Then it waits
for the stream's next REQUEST (POOLED_STREAM_IDLE_S; then it closes the stream quietly), served
the same way.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import structlog
import trio
from libp2p.abc import INetStream

from cnode.storage import CID, BlockNotFoundError, BlockStore, CorruptBlockError

from .. import limits
from .._bucket import TokenBucket
from .._exceptions import FrameTooLargeError, PeerProtocolError, StreamBroken, first_error
from .._traffic import Traffic
from ._stream import Libp2pStream
from ._wire import HEADER_SIZE, Block, End, Error, FrameReader, Lacking, Request, Status

log = structlog.get_logger(__name__)

# What an answer adds to its blocks' bytes, at most: per CID a BLOCK's frame header and CID (or
# its entry in LACKING), and the frame headers of LACKING and END with LACKING's count.
_ANSWER_BYTES_PER_CID = HEADER_SIZE + 1 + limits.MAX_CID_BYTES
_ANSWER_BYTES_FIXED = 2 * HEADER_SIZE + 4


class BlockServer:
    """Answers block requests from allowed peers out of ``store``.

    Args:
        store: where blocks are read from.
        allow: ``allow(peer_id) -> bool``; peers it refuses get an ERROR FORBIDDEN frame.
        bucket: the node's upload token bucket (bytes).
        corrupt_for_tests: TESTING AID ONLY: flip one byte of every block sent, to exercise
            the fetcher's bad-holder handling. Never set outside tests.
        busy_for_tests: TESTING AID ONLY: seconds this holder is busy from its first request
            on: every request that arrives meanwhile gets its first byte only after (a holder
            alive but busy scoring on a loaded machine, issue 41). Never set outside tests.

    Error handling: a bad request gets an ERROR frame and the stream is closed; a broken
    stream is logged and reset. Nothing escapes to the host (see _defects.guard_handler).
    Log lines name the remote side ``requester``: ``peer`` is the node's own id, bound to the
    log context by the process (``cnode.node._logging.bind_context``).
    """

    def __init__(
        self,
        store: BlockStore,
        *,
        allow: Callable[[str], bool],
        bucket: TokenBucket,
        corrupt_for_tests: bool = False,
        busy_for_tests: float = 0.0,
    ) -> None:
        self.store = store
        self.allow = allow
        self.bucket = bucket
        self.corrupt_for_tests = corrupt_for_tests
        self.busy_for_tests = busy_for_tests
        self._busy_until: float | None = None
        self._open: collections.Counter[str] = collections.Counter()
        self.bytes_sent = 0
        self.requests_served = 0
        self.traffic = Traffic()  # bytes by peer: served here, fetched by the node (/metrics)

    async def handle(self, raw: INetStream) -> None:
        peer = str(raw.muxed_conn.peer_id)
        stream = Libp2pStream(raw, peer)
        self._open[peer] += 1
        try:
            reader = FrameReader(stream, read_size=4096)  # one per stream: nothing read is lost
            served = await self._serve(stream, peer, trio.current_time(), reader)
            while served:  # the same stream may carry the requester's next REQUEST
                served = await self._serve_next(stream, peer, reader)
            await stream.close()
        except StreamBroken as exc:
            log.info("serve_stream_broken", requester=peer[-8:], error=str(exc))
            await stream.reset()
        finally:
            self._open[peer] -= 1
            if not self._open[peer]:
                del self._open[peer]

    async def _refuse(self, stream: Libp2pStream, peer: str, status: Status, text: str) -> None:
        log.warning("serve_refused", requester=peer[-8:], status=status.name, reason=text)
        await stream.write(Error(status, text).encode())

    async def _serve(
        self, stream: Libp2pStream, peer: str, arrived: float, reader: FrameReader | None = None
    ) -> bool:
        """Serve a stream's first REQUEST; True once it was answered (its END sent)."""
        if not self.allow(peer):
            await self._refuse(stream, peer, Status.FORBIDDEN, "peer is not allowed to fetch")
            return False
        if self._open[peer] > limits.MAX_SERVED_STREAMS_PER_PEER:
            await self._refuse(stream, peer, Status.BUSY, "too many open requests")
            return False
        reader = reader or FrameReader(stream, read_size=4096)
        frame = await self._read_request(stream, peer, reader)
        if frame is None:
            return False
        await self._answer(stream, peer, frame, arrived)
        return True

    async def _serve_next(self, stream: Libp2pStream, peer: str, reader: FrameReader) -> bool:
        """Serve the stream's next REQUEST, if one comes within POOLED_STREAM_IDLE_S; True once
        answered. The stream already counts in MAX_SERVED_STREAMS_PER_PEER (streams, not
        requests); the allow hook is asked again (a peer banned meanwhile is refused)."""
        frame = await self._read_request(stream, peer, reader, pooled=True)
        if frame is None:
            return False
        if not self.allow(peer):
            await self._refuse(stream, peer, Status.FORBIDDEN, "peer is not allowed to fetch")
            return False
        await self._answer(stream, peer, frame, trio.current_time())
        return True

    async def _answer(
        self, stream: Libp2pStream, peer: str, frame: Request, arrived: float
    ) -> None:
        if self.busy_for_tests:
            if self._busy_until is None:
                self._busy_until = trio.current_time() + self.busy_for_tests
            await trio.sleep_until(self._busy_until)
        small = None if self.bucket.rate else self._read_small(frame.cids)
        if small is not None:
            await self._answer_at_once(stream, peer, small, arrived)
            return
        lacking = []
        waited: list[float] = []  # the request's wait for its first byte, once known

        def first_byte() -> None:
            # From the stream's arrival to its first answer frame: the request's queueing at
            # this holder (the request's own bytes, the disk read, the other streams' turns).
            if not waited:
                waited.append(trio.current_time() - arrived)
                self.traffic.exchange.serve_started(waited[0])

        # The next block is read (and verified) from disk while this one is sent, so the
        # stream never waits on our disk between blocks. The reader holds the one block it has
        # read until the sender takes it: SERVE_READ_AHEAD blocks ahead, beyond the channel.
        read, ready = trio.open_memory_channel[tuple[CID, bytes | None]](
            limits.SERVE_READ_AHEAD - 1
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_blocks, frame.cids, read)
                async with ready:
                    async for cid, data in ready:
                        if data is None:
                            lacking.append(cid)
                            continue
                        if self.corrupt_for_tests and data:
                            data = bytes([data[0] ^ 0xFF]) + data[1:]
                        first_byte()
                        await self._send_block(stream, Block.header(cid, len(data)), data)
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        first_byte()
        if lacking:
            await stream.write(Lacking(tuple(lacking)).encode())
        await stream.write(End().encode())
        self._served(peer, len(frame.cids) - len(lacking), len(lacking))

    def _read_small(self, cids: tuple[CID, ...]) -> list[tuple[CID, bytes | None]] | None:
        """The requested blocks (None for one this store lacks or holds corrupt), read on the
        loop's thread, when the whole answer fits in COALESCED_ANSWER_BYTES; else None (the
        answer is streamed block by block)."""
        sizes = []
        for cid in cids:
            try:
                sizes.append(self.store.size(cid))
            except BlockNotFoundError:
                sizes.append(0)
        framing = _ANSWER_BYTES_FIXED + len(cids) * _ANSWER_BYTES_PER_CID
        if sum(sizes) + framing > limits.COALESCED_ANSWER_BYTES:
            return None
        small: list[tuple[CID, bytes | None]] = []
        for cid in cids:
            try:
                small.append((cid, self.store.get(cid)))
            except (BlockNotFoundError, CorruptBlockError):
                small.append((cid, None))
        return small

    async def _answer_at_once(
        self, stream: Libp2pStream, peer: str, small: list[tuple[CID, bytes | None]], arrived: float
    ) -> None:
        """Answer with one write (one yamux frame, one Noise message): the same frames, in the
        same order, as the answer streamed block by block."""
        parts: list[bytes] = []
        lacking = []
        for cid, data in small:
            if data is None:
                lacking.append(cid)
                continue
            if self.corrupt_for_tests and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            parts += [Block.header(cid, len(data)), data]
        blocks_bytes = sum(len(p) for p in parts)
        if lacking:
            parts.append(Lacking(tuple(lacking)).encode())
        parts.append(End().encode())
        self.traffic.exchange.serve_started(trio.current_time() - arrived)
        await stream.write(b"".join(parts))
        if blocks_bytes:
            self._sent(peer, blocks_bytes)
        self._served(peer, len(small) - len(lacking), len(lacking))

    def _served(self, peer: str, sent: int, lacking: int) -> None:
        self.requests_served += 1
        log.debug("served", requester=peer[-8:], sent=sent, lacking=lacking)

    async def _read_request(
        self, stream: Libp2pStream, peer: str, reader: FrameReader, *, pooled: bool = False
    ) -> Request | None:
        """The stream's next REQUEST, or None once it was refused (or withdrawn). ``pooled``:
        not the stream's first; its requester keeps the stream idle between requests, so a
        quiet one or its end is no fault and is closed without a word (no BUSY)."""
        wait = limits.POOLED_STREAM_IDLE_S if pooled else limits.REQUEST_READ_TIMEOUT_S
        try:
            with trio.fail_after(wait):
                frame = await reader.read_frame(limits.MAX_REQUEST_FRAME)
        except trio.TooSlowError:
            if pooled:
                log.debug("pooled_stream_idle", requester=peer[-8:])
                return None
            # BUSY, not BAD_REQUEST: the REQUEST is most likely queued on the requester's side
            # (behind block data on the same connection, or its loop starved: issue 41 saw it
            # at 12 members), and a refusal would make it drop this holder as if it had
            # refused. BUSY gives the request back to its queue; the stream slot is freed.
            waited = f"{limits.REQUEST_READ_TIMEOUT_S:g} s"
            text = f"no REQUEST within REQUEST_READ_TIMEOUT_S ({waited})"
            await self._refuse(stream, peer, Status.BUSY, text)
            return None
        except FrameTooLargeError as exc:
            await self._refuse(stream, peer, Status.TOO_LARGE, str(exc))
            return None
        except PeerProtocolError as exc:
            await self._refuse(stream, peer, Status.BAD_REQUEST, str(exc))
            return None
        if frame is None and pooled:
            return None  # the requester closed its idle stream: it has no next request
        if frame is None:
            # The requester closed before asking: it gave the request up while its stream was
            # opening (its blocks moved to a faster holder, or its no-progress timer ran out).
            # Not a fault, and nobody is left to read an ERROR.
            log.info("request_withdrawn", requester=peer[-8:])
            return None
        if not isinstance(frame, Request):
            what = type(frame).__name__
            await self._refuse(stream, peer, Status.BAD_REQUEST, f"expected REQUEST, got {what}")
            return None
        return frame

    async def _read_blocks(
        self, cids: tuple[CID, ...], read: trio.MemorySendChannel[tuple[CID, bytes | None]]
    ) -> None:
        """Read the requested blocks in order; None for one this store lacks (or holds corrupt,
        which the store quarantines). A block of at most INLINE_BLOCK_BYTES is read on the
        loop's thread (cheaper than a thread hop), a larger one in a worker thread; the size
        is the file's, and the store verifies whatever it reads against the CID either way."""
        async with read:
            for cid in cids:
                try:
                    if self.store.size(cid) <= limits.INLINE_BLOCK_BYTES:
                        data: bytes | None = self.store.get(cid)
                    else:
                        data = await trio.to_thread.run_sync(self.store.get, cid)
                except (BlockNotFoundError, CorruptBlockError):
                    data = None
                await read.send((cid, data))

    async def _send_block(self, stream: Libp2pStream, header: bytes, data: bytes) -> None:
        if not self.bucket.rate:  # uncapped: one write, yamux cuts it into frames itself
            await stream.write(header + data)
            self._sent(stream.peer, len(header) + len(data))
            return
        view = memoryview(data)
        first = limits.SEND_PIECE - len(header)
        await self.bucket.take(len(header) + min(first, len(view)))
        await stream.write(header + bytes(view[:first]))
        for start in range(first, len(view), limits.SEND_PIECE):
            piece = view[start : start + limits.SEND_PIECE]
            await self.bucket.take(len(piece))
            await stream.write(bytes(piece))
        self._sent(stream.peer, len(header) + len(data))

    def _sent(self, peer: str, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.traffic.served(peer, nbytes)
