"""Frames of ``/cnode/blocks/1.0.0``: see specs/blocks.md#messages.

Every frame is ``kind (u8) | length (u32, big-endian) | body``. Each message is a frozen dataclass
with one ``encode`` and one ``decode``; :func:`decode_frame` is the only dispatch. Nothing here
does I/O except :class:`FrameReader`, which reads frames from a :class:`ByteStream` under a size
bound chosen by its caller.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cnode.storage import CID, InvalidCIDError

from .. import limits
from .._exceptions import FrameTooLargeError, PeerProtocolError

PROTOCOL_ID = "/cnode/blocks/1.0.0"
# Same framing, its own protocol: a peer shows its access token (specs/blocks.md#admission).
ADMIT_PROTOCOL_ID = "/cnode/admit/1.0.0"
_HEADER = struct.Struct(">BI")
HEADER_SIZE = _HEADER.size


class FrameKind(enum.IntEnum):
    """Frame kinds (specs/blocks.md#messages)."""

    REQUEST = 1  # C -> S: the CIDs C wants, in the order it prefers them
    BLOCK = 2  # S -> C: one block: its CID and its bytes
    LACKING = 3  # S -> C: requested CIDs S does not hold
    END = 4  # S -> C: every requested CID was answered by BLOCK or LACKING
    ERROR = 5  # S -> C: the request is refused; status and text say why
    ADMIT = 6  # C -> S (/cnode/admit/1.0.0): C's access token, signed by the run's coordinator
    ADMITTED = 7  # S -> C: the token is accepted until expires_at (Unix seconds)


class Status(enum.IntEnum):
    """Status codes carried by ERROR frames (specs/blocks.md#status-codes)."""

    BAD_REQUEST = 1  # the request frame is malformed (bad kind, bad CID, truncated)
    TOO_LARGE = 2  # the request frame or its CID count is over the limits
    FORBIDDEN = 3  # the requester is not allowed to receive blocks from this holder
    BUSY = 4  # MAX_SERVED_STREAMS_PER_PEER requests open here, or no REQUEST in time: ask again
    INTERNAL = 5  # the holder failed to read its own store


class ByteStream(Protocol):
    """The three methods block exchange needs from a stream (libp2p or in-memory)."""

    async def read(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` at end of stream."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


def _encode_cids(cids: tuple[CID, ...]) -> bytes:
    parts = [struct.pack(">H", len(cids))]
    for cid in cids:
        raw = bytes(cid)
        parts.append(bytes([len(raw)]) + raw)
    return b"".join(parts)


def _decode_cids(body: bytes, what: str) -> tuple[CID, ...]:
    if len(body) < 2:
        raise PeerProtocolError(f"{what} frame too short")
    (count,) = struct.unpack_from(">H", body)
    if count > limits.MAX_REQUEST_CIDS:
        raise FrameTooLargeError(f"{what} lists {count} CIDs, over MAX_REQUEST_CIDS")
    pos, out = 2, []
    for _ in range(count):
        if pos >= len(body):
            raise PeerProtocolError(f"{what} frame truncated")
        size = body[pos]
        pos += 1
        if size > limits.MAX_CID_BYTES or pos + size > len(body):
            raise PeerProtocolError(f"{what} frame has a bad CID length {size}")
        try:
            out.append(CID.parse(body[pos : pos + size]))
        except InvalidCIDError as exc:
            raise PeerProtocolError(f"{what} frame has a bad CID: {exc}") from exc
        pos += size
    if pos != len(body):
        raise PeerProtocolError(f"{what} frame has {len(body) - pos} trailing bytes")
    return tuple(out)


def _frame(kind: FrameKind, body: bytes) -> bytes:
    return _HEADER.pack(kind, len(body)) + body


@dataclass(frozen=True)
class Request:
    """C asks S for these blocks (1 to MAX_REQUEST_CIDS CIDs)."""

    cids: tuple[CID, ...]

    def encode(self) -> bytes:
        return _frame(FrameKind.REQUEST, _encode_cids(self.cids))

    @classmethod
    def decode(cls, body: bytes) -> Request:
        cids = _decode_cids(body, "REQUEST")
        if not cids:
            raise PeerProtocolError("REQUEST frame lists no CIDs")
        return cls(cids)


@dataclass(frozen=True)
class Block:
    """One block: the CID it answers and its bytes (at most MAX_BLOCK_SIZE)."""

    cid: CID
    data: bytes

    @staticmethod
    def header(cid: CID, size: int) -> bytes:
        """Frame header and CID prefix; the block's ``size`` bytes follow (sent streaming)."""
        raw = bytes(cid)
        return _HEADER.pack(FrameKind.BLOCK, 1 + len(raw) + size) + bytes([len(raw)]) + raw

    def encode(self) -> bytes:
        return self.header(self.cid, len(self.data)) + self.data

    @classmethod
    def decode(cls, body: bytes) -> Block:
        return cls.decode_parts([body])

    @classmethod
    def decode_parts(cls, parts: list[bytes]) -> Block:
        """The BLOCK whose body is ``b"".join(parts)``, its data joined once (FrameReader)."""
        head = parts[0]
        if len(parts) > 1 and (not head or len(head) < 1 + head[0]):
            head = b"".join(parts)  # a body split before its CID ended (tiny reads)
            parts = [head]
        if not head:
            raise PeerProtocolError("BLOCK frame is empty")
        size = head[0]
        if size > limits.MAX_CID_BYTES or 1 + size > len(head):
            raise PeerProtocolError(f"BLOCK frame has a bad CID length {size}")
        try:
            cid = CID.parse(head[1 : 1 + size])
        except InvalidCIDError as exc:
            raise PeerProtocolError(f"BLOCK frame has a bad CID: {exc}") from exc
        if len(parts) == 1:
            return cls(cid, head[1 + size :])
        return cls(cid, b"".join([head[1 + size :], *parts[1:]]))


@dataclass(frozen=True)
class Lacking:
    """S does not hold these requested blocks."""

    cids: tuple[CID, ...]

    def encode(self) -> bytes:
        return _frame(FrameKind.LACKING, _encode_cids(self.cids))

    @classmethod
    def decode(cls, body: bytes) -> Lacking:
        return cls(_decode_cids(body, "LACKING"))


@dataclass(frozen=True)
class End:
    """Every requested CID has been answered."""

    def encode(self) -> bytes:
        return _frame(FrameKind.END, b"")

    @classmethod
    def decode(cls, body: bytes) -> End:
        if body:
            raise PeerProtocolError("END frame must be empty")
        return cls()


@dataclass(frozen=True)
class Error:
    """S refuses the request: a status code and a short text (at most MAX_ERROR_TEXT bytes)."""

    status: Status
    text: str

    def encode(self) -> bytes:
        text = self.text.encode("utf-8")[: limits.MAX_ERROR_TEXT]
        return _frame(FrameKind.ERROR, bytes([self.status]) + text)

    @classmethod
    def decode(cls, body: bytes) -> Error:
        if not body or len(body) > 1 + limits.MAX_ERROR_TEXT:
            raise PeerProtocolError("ERROR frame has a bad length")
        try:
            status = Status(body[0])
        except ValueError as exc:
            raise PeerProtocolError(f"ERROR frame has unknown status {body[0]}") from exc
        return cls(status, body[1:].decode("utf-8", errors="replace"))


@dataclass(frozen=True)
class Admit:
    """C shows S its access token (an auth envelope, at most MAX_ADMIT_TOKEN bytes)."""

    token: bytes

    def encode(self) -> bytes:
        return _frame(FrameKind.ADMIT, self.token)

    @classmethod
    def decode(cls, body: bytes) -> Admit:
        if not body or len(body) > limits.MAX_ADMIT_TOKEN:
            raise PeerProtocolError(f"ADMIT frame of {len(body)} bytes (1..MAX_ADMIT_TOKEN)")
        return cls(body)


@dataclass(frozen=True)
class Admitted:
    """S accepts C's token: C may fetch blocks until ``expires_at`` (Unix seconds)."""

    expires_at: int

    def encode(self) -> bytes:
        return _frame(FrameKind.ADMITTED, struct.pack(">Q", self.expires_at))

    @classmethod
    def decode(cls, body: bytes) -> Admitted:
        if len(body) != 8:
            raise PeerProtocolError("ADMITTED frame must hold 8 bytes")
        return cls(struct.unpack(">Q", body)[0])


Frame = Request | Block | Lacking | End | Error | Admit | Admitted
_DECODERS: dict[FrameKind, Callable[[bytes], Frame]] = {
    FrameKind.REQUEST: Request.decode,
    FrameKind.BLOCK: Block.decode,
    FrameKind.LACKING: Lacking.decode,
    FrameKind.END: End.decode,
    FrameKind.ERROR: Error.decode,
    FrameKind.ADMIT: Admit.decode,
    FrameKind.ADMITTED: Admitted.decode,
}


def decode_frame(kind: int, body: bytes) -> Frame:
    """The message for one frame; PeerProtocolError for an unknown kind or a bad body."""
    try:
        decoder = _DECODERS[FrameKind(kind)]
    except ValueError as exc:
        raise PeerProtocolError(f"unknown frame kind {kind}") from exc
    return decoder(body)


class FrameReader:
    """Reads whole frames from a ByteStream, buffering so small headers cost no extra reads.

    Resource handling: holds at most one frame plus one read's worth of bytes.
    Error handling: PeerProtocolError for a frame over ``max_body`` or a stream that ends inside
    a frame; StreamBroken (from the stream) passes through.
    """

    def __init__(self, stream: ByteStream, *, read_size: int = 256 * 1024) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._read_size = read_size

    async def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            data = await self._stream.read(max(self._read_size, n - len(self._buf)))
            if not data:
                return False
            self._buf += data
        return True

    async def read_frame(
        self, max_body: int, on_block_cid: Callable[[CID], None] | None = None
    ) -> Frame | None:
        """The next frame, or None at a clean end of stream (between frames).

        ``on_block_cid``, if given, is called with a BLOCK frame's CID as soon as the frame
        header and CID have arrived, before the block's bytes are read (a requester can give
        up a block it no longer wants without waiting for it); what it raises passes through.
        """
        if not await self._fill(HEADER_SIZE):
            if self._buf:
                raise PeerProtocolError("stream ended inside a frame header")
            return None
        kind, length = _HEADER.unpack_from(self._buf)
        if length > max_body:
            raise FrameTooLargeError(f"frame of {length} bytes exceeds the limit {max_body}")
        if on_block_cid is not None and kind == FrameKind.BLOCK:
            cid = await self._peek_block_cid(length)
            if cid is not None:
                on_block_cid(cid)
        if kind == FrameKind.BLOCK and len(self._buf) < HEADER_SIZE + length:
            return await self._read_block(length)
        if not await self._fill(HEADER_SIZE + length):
            raise PeerProtocolError("stream ended inside a frame")
        body = bytes(self._buf[HEADER_SIZE : HEADER_SIZE + length])
        del self._buf[: HEADER_SIZE + length]
        return decode_frame(kind, body)

    async def _read_block(self, length: int) -> Block:
        # A BLOCK body still arriving (up to 1 MiB): its pieces are kept as read and joined
        # once, without the CID prefix, so the block's bytes are copied once here (a bytearray
        # buffer would copy them three times: append, slice, and the data slice in decode).
        parts = [bytes(self._buf[HEADER_SIZE:])]
        have = len(parts[0])
        self._buf = bytearray()
        while have < length:
            data = await self._stream.read(max(self._read_size, length - have))
            if not data:
                raise PeerProtocolError("stream ended inside a frame")
            parts.append(data)
            have += len(data)
        if have > length:  # the next frame began in the last read
            extra = have - length
            self._buf = bytearray(parts[-1][-extra:])
            parts[-1] = parts[-1][:-extra]
        return Block.decode_parts(parts)

    async def _peek_block_cid(self, length: int) -> CID | None:
        # The CID at the front of a BLOCK body, or None when it is not there (yet): the full
        # decode that follows reports any fault.
        if length < 1 or not await self._fill(HEADER_SIZE + 1):
            return None
        size = self._buf[HEADER_SIZE]
        if size > limits.MAX_CID_BYTES or 1 + size > length:
            return None
        if not await self._fill(HEADER_SIZE + 1 + size):
            return None
        try:
            return CID.parse(bytes(self._buf[HEADER_SIZE + 1 : HEADER_SIZE + 1 + size]))
        except InvalidCIDError:
            return None
