"""The minimum useful rate of a source (specs/blocks.md#fetching, specs/gateway.md#limits).

A source that trickles (a byte every few seconds, the right bytes) never trips the scheduler's
no-progress timer: every piece resets it. :class:`RateWindow` measures what one source
delivered on the wire while it had a request in flight; the scheduler asks it every
SOURCE_RATE_WINDOW_S / 4 and drops a source under MIN_SOURCE_RATE over a whole window.
:class:`CountedStream` counts a libp2p stream's bytes into a window (a gateway counts its own
pieces). Times come from ``trio.current_time()``.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from .. import limits
from .._blocks._wire import ByteStream


class RateWindow:
    """Bytes one source delivered since its current window began (windows run while busy)."""

    def __init__(self) -> None:
        self.received = 0  # bytes received on the wire over the whole transfer
        self._start: float | None = None  # when the current window began; None while idle
        self._start_received = 0

    def add(self, n: int) -> None:
        self.received += n

    def busy(self) -> None:
        """The source has a request in flight: a window starts unless one runs."""
        if self._start is None:
            self._start, self._start_received = trio.current_time(), self.received

    def idle(self) -> None:
        """No request in flight: nothing is owed, the next request starts a fresh window."""
        self._start = None

    def too_slow(self) -> str | None:
        """Why the source is too slow, once a whole window delivered under MIN_SOURCE_RATE;
        None otherwise (a window that met the rate is closed and the next one begins)."""
        if self._start is None:
            return None
        now = trio.current_time()
        elapsed = now - self._start
        if elapsed < limits.SOURCE_RATE_WINDOW_S:
            return None
        got = self.received - self._start_received
        if got < limits.MIN_SOURCE_RATE * elapsed:
            return (
                f"too slow: {got} bytes in {elapsed:.1f} s, under MIN_SOURCE_RATE "
                f"({limits.MIN_SOURCE_RATE} bytes/s over {limits.SOURCE_RATE_WINDOW_S:g} s)"
            )
        self._start, self._start_received = now, self.received
        return None


class CountedStream:
    """A request stream whose received bytes are counted (``count(n)`` after every read)."""

    def __init__(self, stream: ByteStream, count: Callable[[int], None]) -> None:
        self._stream = stream
        self._count = count

    async def read(self, max_bytes: int) -> bytes:
        data = await self._stream.read(max_bytes)
        self._count(len(data))
        return data

    async def write(self, data: bytes) -> None:
        await self._stream.write(data)

    async def close(self) -> None:
        await self._stream.close()
