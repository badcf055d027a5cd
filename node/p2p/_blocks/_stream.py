"""The adapter between py-libp2p streams and the three-method ByteStream of _wire.py.

py-libp2p's exceptions stay here: :func:`map_exceptions` translates them, chained with ``from``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

from libp2p.abc import INetStream
from libp2p.exceptions import BaseLibp2pError
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.protocol_muxer.exceptions import MultiselectClientError

from .._exceptions import StreamBroken


@contextmanager
def map_exceptions(what: str) -> Iterator[None]:
    """Turn any py-libp2p error inside into StreamBroken naming ``what``."""
    try:
        yield
    except BaseLibp2pError as exc:
        raise StreamBroken(f"{what}: {type(exc).__name__}: {exc}") from exc


class Libp2pStream:
    """A libp2p stream as a ByteStream: ``b""`` at end of stream, StreamBroken on reset."""

    def __init__(self, stream: INetStream, peer: str) -> None:
        self.raw = stream
        self.peer = peer

    async def read(self, max_bytes: int) -> bytes:
        try:
            with map_exceptions(f"reading from {self.peer[-8:]}"):
                return await self.raw.read(max_bytes)
        except StreamBroken as exc:
            if isinstance(exc.__cause__, StreamEOF):
                return b""
            raise

    async def write(self, data: bytes) -> None:
        with map_exceptions(f"writing to {self.peer[-8:]}"):
            await self.raw.write(data)

    async def close(self) -> None:
        with map_exceptions(f"closing stream with {self.peer[-8:]}"):
            await self.raw.close()

    def connection_closed(self) -> bool:
        """Has the stream's connection closed (an idle pooled stream is then of no use)?"""
        return bool(getattr(self.raw.muxed_conn, "is_closed", False))

    async def reset(self) -> None:
        # Resetting an already broken stream fails: nothing is left to tell the peer.
        with contextlib.suppress(BaseLibp2pError):
            await self.raw.reset()


def selection_timed_out(exc: BaseException) -> bool:
    """Did a new stream fail because its protocol selection timed out (py-libp2p's
    MultiselectClientError "response timed out", under StreamFailure)?"""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MultiselectClientError) and "timed out" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
