"""Idle block streams kept for the next request to the same holder (specs/blocks.md#interaction).

A request that ended cleanly (its END read) gives its stream back here; the node's next request
to that holder, from any transfer, takes it instead of opening a new stream (a new stream costs
a multiselect negotiation, a close, and several small encrypted writes on both sides). At most
MAX_STREAMS_PER_HOLDER idle streams per holder; one idle for POOLED_STREAM_MAX_AGE_S, or whose
connection closed, is closed instead of used. Streams that failed in any way are never given
back (the scheduler resets them).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from .. import limits
from .._exceptions import PeerProtocolError, StreamBroken
from ._fetch_types import OpenStream, RequestStream
from ._holders import InFlight

T = TypeVar("T")

__all__ = ["StreamPool", "ask_holder", "request_sent"]


class StreamPool:
    """Idle streams by holder, newest last. One per node, shared by all its transfers.

    Resource handling: :meth:`close_all` closes every idle stream (the node does so when it
    stops); :meth:`sweep` closes the expired ones and those whose connection closed.
    """

    def __init__(self, prepare: Callable[[str], Awaitable[None]] | None = None) -> None:
        # Awaited before a request takes an idle stream to a holder: what a new stream's
        # opening would have done first (the node shows its access token when it is due).
        self.prepare = prepare
        self._idle: dict[str, collections.deque[tuple[float, RequestStream]]] = {}
        self._stale: list[RequestStream] = []  # dropped by ``take``, closed by ``sweep``
        self.opened = 0  # new streams opened for requests (pooled or not)
        self.reused = 0  # requests that took a pooled stream
        self.replaced = 0  # ... and found it closed by the holder: asked again on a new one
        self.expired = 0  # idle streams closed unused (too old, or their connection closed)

    def __len__(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def take(self, holder: str) -> RequestStream | None:
        """The newest usable idle stream to ``holder``, or None (the caller opens one).

        Expired streams met on the way are dropped from the pool; their closing is left to
        :meth:`sweep` (taking never waits)."""
        queue = self._idle.get(holder)
        now = trio.current_time()
        while queue:
            since, stream = queue.pop()
            if now - since < limits.POOLED_STREAM_MAX_AGE_S and not stream.connection_closed():
                if not queue:
                    del self._idle[holder]
                self.reused += 1
                return stream
            self._stale.append(stream)
        self._idle.pop(holder, None)
        return None

    def give(self, holder: str, stream: RequestStream) -> bool:
        """Keep ``stream`` (its request ended cleanly) for the next request to ``holder``;
        False when the holder has MAX_STREAMS_PER_HOLDER idle already (the caller closes it)."""
        queue = self._idle.setdefault(holder, collections.deque())
        if len(queue) >= limits.MAX_STREAMS_PER_HOLDER:
            return False
        queue.append((trio.current_time(), stream))
        return True

    async def sweep(self) -> None:
        """Close the streams :meth:`take` passed over, those idle too long, and those whose
        connection closed (each close bounded: a holder gone quiet cannot hold it)."""
        now = trio.current_time()
        for holder, queue in list(self._idle.items()):
            keep = [
                (since, s)
                for since, s in queue
                if now - since < limits.POOLED_STREAM_MAX_AGE_S and not s.connection_closed()
            ]
            self._stale.extend(entry[1] for entry in queue if entry not in keep)
            if keep:
                self._idle[holder] = collections.deque(keep)
            else:
                del self._idle[holder]
        stale, self._stale = self._stale, []
        self.expired += len(stale)
        for stream in stale:
            await _close(stream)

    async def close_all(self) -> None:
        """Close every idle stream (the node stops)."""
        streams = [s for q in self._idle.values() for _, s in q] + self._stale
        self._idle.clear()
        self._stale = []
        for stream in streams:
            await _close(stream)

    async def run_sweeps(self) -> None:
        """:meth:`sweep` every POOLED_STREAM_MAX_AGE_S / 2; until cancelled."""
        while True:
            await trio.sleep(limits.POOLED_STREAM_MAX_AGE_S / 2)
            await self.sweep()


async def _close(stream: RequestStream) -> None:
    # Bounded: a holder gone quiet cannot hold it; one that closed or reset it first gets a reset.
    try:
        with trio.fail_after(1):
            await stream.close()
    except (StreamBroken, trio.TooSlowError):
        await stream.reset()


async def ask_holder(
    pool: StreamPool | None,
    open_stream: OpenStream,
    request: InFlight,
    ask: Callable[[RequestStream, Callable[[], bool]], Awaitable[T]],
    answered: Callable[[], bool],
) -> T:
    """``await ask(stream, pooled)`` on an idle stream to ``request``'s holder from ``pool``,
    else on a new one from ``open_stream``; ``pooled()`` gives the stream back to the pool (its
    request ended cleanly; False when the pool is full). Once the stream is in hand the
    request's ``sent_at`` is set and its scope's open deadline lifted (the stall watch rules).

    A pooled stream that ends or breaks before ``answered()`` (no byte of an answer came) was
    closed by the holder while idle (POOLED_STREAM_IDLE_S): not the holder's fault, so the
    request is asked once more on a new stream, opened under OPEN_TIMEOUT_S as any, and that
    first failure is neither raised nor counted against the holder.
    """
    holder = request.holder.peer
    stream = None
    if pool is not None:
        if pool.prepare is not None:
            await pool.prepare(holder)
        stream = pool.take(holder)
    if stream is not None:
        request_sent(request)
        try:
            return await ask(stream, _giver(pool, holder, stream))
        except (StreamBroken, PeerProtocolError):
            if answered():
                raise
        assert pool is not None and request.scope is not None
        pool.replaced += 1
        request.sent_at = None  # no REQUEST on the wire while the new stream opens
        request.scope.deadline = trio.current_time() + limits.OPEN_TIMEOUT_S
    stream = await open_stream(holder)
    if pool is not None:
        pool.opened += 1
    request_sent(request)
    return await ask(stream, _giver(pool, holder, stream))


def request_sent(request: InFlight) -> None:
    """``request``'s stream is in hand (or its direct holder asked): its REQUEST goes out now."""
    request.sent_at = trio.current_time()
    if request.scope is not None:
        request.scope.deadline = math.inf  # now the stall watch (``_holders.stalled``) rules
    request.holder.window.busy()


def _giver(pool: StreamPool | None, holder: str, stream: RequestStream) -> Callable[[], bool]:
    return lambda: pool is not None and pool.give(holder, stream)
