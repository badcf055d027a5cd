"""Long polls of round records (``GET .../rounds/{n}?wait=S&until=...``): who waits for which
round to be published, agreed, to have every partition's result, its score records closed, or
a checkpoint of it or a later round recorded, and waking them after a change. See
specs/coordinator.md#a-round.

Every node waits on one such poll per phase instead of re-reading the round record every
POLL_INTERVAL_S: at 16 nodes on 2 cores the re-reads were most of the coordinator's ~6,500
requests a round (issue 27).

A change wakes only the waiters whose round it finished (1,000 waiters x every ready would not
do). Events are kept only for rounds up to the next one and at most MAX_POLLED_ROUNDS of each
kind: a poll of any other round sleeps its wait, so polls of arbitrary rounds keep nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from .. import limits
from .._store._store import Store
from .._wire._protocol import RoundStatus, Until

__all__ = ["RoundWaits"]

# Conditions that become true with time alone (the pace rule closes score records without a
# request): their waiters are checked on every tick, not only after a change.
TIMED = (Until.SCORES,)

ScoresClosed = Callable[[int, float], bool]


class RoundWaits:
    """``await waits.wait(n, until, seconds)``; ``waits.wake()`` after every committed change
    (and on every tick while :meth:`timed` has waiters)."""

    def __init__(self, store: Store, scores_closed: ScoresClosed | None = None) -> None:
        self.store = store
        # (round, now) -> whether its score records are closed (the partition rules' verdict);
        # without it (no partitioned rounds), "scores" waits for the round to be agreed.
        self.scores_closed = scores_closed
        self.events: dict[Until, dict[int, asyncio.Event]] = {until: {} for until in Until}

    def timed(self) -> bool:
        """Someone waits for a condition that time alone can make true."""
        return any(self.events[until] for until in TIMED)

    def results_done(self, n: int) -> bool:
        """Round ``n`` is agreed, or published with a result for every partition."""
        row = self.store.round_row(n)
        if row is None or not row.listed:
            return False
        return row.status is RoundStatus.AGREED or len(self.store.results(n)) >= row.parts

    def _agreed(self, n: int) -> bool:
        row = self.store.round_row(n)
        return row is not None and row.status is RoundStatus.AGREED

    def _scores_done(self, n: int) -> bool:
        row = self.store.round_row(n)
        if row is None or not row.listed:
            return False
        if row.status is RoundStatus.AGREED or not row.parts:
            return True  # agreed, or a full-replication round: it has no score phase
        return self.scores_closed is not None and self.scores_closed(n, time.time())

    def _checkpointed(self, n: int) -> bool:
        latest = self.store.latest_checkpoint()
        return latest is not None and latest.round >= n

    def _done(self, n: int, until: Until, current: int) -> bool:
        match until:
            case Until.PUBLISHED:
                return n < current
            case Until.AGREED:
                return self._agreed(n)
            case Until.SCORES:
                return self._scores_done(n)
            case Until.CHECKPOINT:
                return self._checkpointed(n)
            case Until.RESULTS:
                return self.results_done(n)

    async def wait(self, n: int, until: Until, seconds: float) -> None:
        """Return once round ``n`` reached ``until``, or after ``seconds``."""
        waiting = self.events[until]
        current = self.store.run_row().round
        if n > current + 1 or (n not in waiting and len(waiting) >= limits.MAX_POLLED_ROUNDS):
            await asyncio.sleep(seconds)  # no event kept for it
            return
        if not self._done(n, until, current):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiting.setdefault(n, asyncio.Event()).wait(), seconds)

    def wake(self) -> None:
        """Set (and drop) the events of every round a change finished."""
        current = self.store.run_row().round
        for until, waiting in self.events.items():
            for n in [n for n in waiting if self._done(n, until, current)]:
                waiting.pop(n).set()
