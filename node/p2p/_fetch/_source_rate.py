"""The minimum useful rate of a source (specs/blocks.md#fetching, specs/gateway.md#limits).

A source that trickles (a byte every few seconds, the right bytes) never trips the scheduler's
no-progress timer: every piece resets it. :class:`RateWindow` measures what one source
delivered on the wire while it had a request in flight; the scheduler asks it every
SOURCE_RATE_WINDOW_S / 4 and drops a source under MIN_SOURCE_RATE over a whole window when
another source did better over that window, or after LONE_SLOW_WINDOWS such windows in a row
(``_holders.watch_rates``; a slow source is not a dead one).
:class:`CountedStream` counts a libp2p stream's bytes into a window (a gateway counts its own
pieces). Times come from ``trio.current_time()``.
"""

from __future__ import annotations

import collections
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
        self.slow_windows = 0  # whole windows in a row under the rate (reset by one that met it)
        # (time, received) at each of the scheduler's checks, a little over one window back:
        # what another source's window is compared with (``received_since``).
        self._samples: collections.deque[tuple[float, int]] = collections.deque(
            [(trio.current_time(), 0)]
        )

    def add(self, n: int) -> None:
        self.received += n

    def busy(self) -> None:
        """The source has a request in flight: a window starts unless one runs."""
        if self._start is None:
            self._start, self._start_received = trio.current_time(), self.received

    def idle(self) -> None:
        """No request in flight: nothing is owed, the next request starts a fresh window."""
        self._start = None

    def sample(self) -> None:
        """Note what has arrived so far (the scheduler calls this at every check)."""
        now = trio.current_time()
        self._samples.append((now, self.received))
        horizon = now - 1.5 * limits.SOURCE_RATE_WINDOW_S
        while len(self._samples) > 2 and self._samples[1][0] <= horizon:
            self._samples.popleft()

    def received_since(self, t: float) -> int:
        """Bytes received since ``t``, at the sample granularity (from the latest sample at or
        before ``t``: never less than what arrived since)."""
        base = self._samples[0][1]
        for when, received in self._samples:
            if when > t:
                break
            base = received
        return self.received - base

    def too_slow(self) -> tuple[float, str] | None:
        """When the current window began and why the source is too slow, once a whole window
        delivered under MIN_SOURCE_RATE; None otherwise (a window that met the rate is closed
        and the next one begins, and the run of slow windows ends)."""
        if self._start is None:
            return None
        now = trio.current_time()
        elapsed = now - self._start
        if elapsed < limits.SOURCE_RATE_WINDOW_S:
            return None
        got = self.received - self._start_received
        if got < limits.MIN_SOURCE_RATE * elapsed:
            return self._start, (
                f"too slow: {got} bytes in {elapsed:.1f} s, under MIN_SOURCE_RATE "
                f"({limits.MIN_SOURCE_RATE} bytes/s over {limits.SOURCE_RATE_WINDOW_S:g} s)"
            )
        self._start, self._start_received = now, self.received
        self.slow_windows = 0
        return None

    def kept_slow(self) -> None:
        """A slow window whose source is kept (nobody did better): the next window begins."""
        self.slow_windows += 1
        self._start, self._start_received = trio.current_time(), self.received


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
