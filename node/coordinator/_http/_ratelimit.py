"""Per-peer token buckets (in memory: a restart forgets them, which only ever lets more through)."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["RateLimiter"]


class RateLimiter:
    """``take(key, now)`` spends one token of ``key``'s bucket or says how long to wait.

    Buckets hold ``burst`` tokens and refill at ``rate`` per second. At most ``max_keys`` buckets
    are kept; the least recently used is forgotten first (a forgotten peer starts full again).
    """

    def __init__(self, burst: int, rate: float, max_keys: int) -> None:
        self.burst = float(burst)
        self.rate = rate
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str, now: float) -> float:
        """Return 0.0 if allowed (one token spent), else the seconds until a token is there."""
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait
