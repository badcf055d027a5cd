"""An upload rate cap: a token bucket shared by every stream a node serves."""

from __future__ import annotations

import trio


class TokenBucket:
    """Lets at most ``rate`` units per second through, with bursts up to ``burst`` units.

    Args:
        rate: units (bytes) per second; 0 means no cap.
        burst: the most units that may pass at once after an idle spell (default: rate / 10,
            at least 64 KiB, so a 1 MiB block leaves in pieces and several streams share fairly).

    Callers take units with :meth:`take` before they send. Takers wait in arrival order (a
    ``trio.Lock`` is fair), so one stream cannot starve the others.
    """

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate < 0:
            raise ValueError("rate must be >= 0")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate / 10, 64 * 1024))
        self._tokens = self.burst
        self._stamp = trio.current_time() if rate else 0.0
        self._lock = trio.Lock()

    def _refill(self) -> None:
        now = trio.current_time()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, amount: int) -> None:
        """Wait until ``amount`` units may pass, then take them (amount may exceed burst)."""
        if not self.rate or amount <= 0:
            await trio.lowlevel.checkpoint()
            return
        async with self._lock:
            self._refill()
            self._tokens -= amount
            if self._tokens < 0:
                # Go into debt and sleep it off: exact long-run rate, no busy loop.
                await trio.sleep(-self._tokens / self.rate)
                self._refill()
