"""The coordinator's evidence checks: how many run at once, each member's share, and how fast an
evidence upload must arrive. See specs/coordinator.md#evidence-of-a-wrong-result.

A check (an evidence upload read and recomputed, or a reputation replay) holds one of
MAX_EVIDENCE_CHECKS slots. One member holds at most MAX_EVIDENCE_CHECKS_PER_PEER of them, and an
upload that brings less than the minimum rate in any window, or is not done by its deadline, is
cut with 408: no member can keep the others' evidence waiting.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import limits
from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from ._http import RateLimitedRefusal

__all__ = ["EvidenceSlots", "EvidenceTiming", "read_evidence_body"]

_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class EvidenceTiming:
    """Waits and rates of evidence checks (``ServeSettings.evidence_timing``; tests shorten
    them, production keeps the named limits)."""

    queue_wait_s: float = limits.EVIDENCE_QUEUE_WAIT_S  # wait for a free check, then 429 busy
    retry_after_s: float = limits.EVIDENCE_RETRY_AFTER_S  # Retry-After of busy / evidence_share
    window_s: float = limits.EVIDENCE_RATE_WINDOW_S  # each window of the body must bring...
    min_rate_bps: float = limits.EVIDENCE_MIN_RATE_BPS  # ...at least this many bytes a second
    body_deadline_s: float = limits.EVIDENCE_BODY_DEADLINE_S  # the whole body by then


class EvidenceSlots:
    """``async with slots.hold(peer):`` one evidence check; refusals are 429 with Retry-After.

    ``evidence_share`` at once when ``peer`` already holds (or waits for) its share;
    ``busy`` when no check frees up within ``timing.queue_wait_s``.
    """

    def __init__(self, slots: int, per_peer: int, timing: EvidenceTiming) -> None:
        self.slots = slots
        self.per_peer = per_peer
        self.timing = timing
        self._free = asyncio.Semaphore(slots)
        self._held: Counter[str] = Counter()  # checks each peer holds or waits for

    def held(self, peer: str) -> int:
        return self._held[peer]

    @asynccontextmanager
    async def hold(self, peer: str) -> AsyncIterator[None]:
        wait = self.timing.retry_after_s
        if self._held[peer] >= self.per_peer:
            raise RateLimitedRefusal(
                wait,
                E.EVIDENCE_SHARE,
                f"this peer holds {self._held[peer]} evidence check(s), its share "
                f"(MAX_EVIDENCE_CHECKS_PER_PEER = {self.per_peer})",
            )
        self._held[peer] += 1  # counted while it waits too: a share cannot queue up behind
        try:
            try:
                await asyncio.wait_for(self._free.acquire(), self.timing.queue_wait_s)
            except TimeoutError as exc:
                raise RateLimitedRefusal(
                    wait,
                    E.BUSY,
                    f"all {self.slots} evidence checks (MAX_EVIDENCE_CHECKS) are in use",
                ) from exc
            try:
                yield
            finally:
                self._free.release()
        finally:
            self._held[peer] -= 1
            if not self._held[peer]:
                del self._held[peer]


async def read_evidence_body(request: web.Request, timing: EvidenceTiming) -> bytes:
    """The whole body, at most MAX_EVIDENCE_BYTES (413 beyond, before or while reading), every
    ``timing.window_s`` window bringing ``timing.min_rate_bps`` and all of it within
    ``timing.body_deadline_s`` (408 ``too_slow`` otherwise: a trickle cannot hold a check)."""
    bound = limits.MAX_EVIDENCE_BYTES
    if (request.content_length or 0) > bound:
        raise RequestRefused(E.TOO_LARGE, f"evidence over MAX_EVIDENCE_BYTES ({bound})")
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + timing.body_deadline_s
    window_end, window_bytes = start + timing.window_s, 0
    least = timing.min_rate_bps * timing.window_s
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk: bytes | None = None
        try:
            async with asyncio.timeout_at(min(window_end, deadline)):
                chunk = await request.content.read(_READ_CHUNK)
        except TimeoutError:
            pass  # no byte until the window's end: judged below
        except HttpProcessingError as exc:  # the sender closed before its Content-Length
            raise RequestRefused(E.BAD_REQUEST, f"evidence body cut short: {exc.message}") from exc
        if chunk == b"":
            return b"".join(chunks)
        if chunk:
            size += len(chunk)
            window_bytes += len(chunk)
            if size > bound:
                raise RequestRefused(E.TOO_LARGE, f"evidence over MAX_EVIDENCE_BYTES ({bound})")
            chunks.append(chunk)
        now = loop.time()
        if now >= deadline:
            raise RequestRefused(
                E.TOO_SLOW,
                f"evidence body not complete after {timing.body_deadline_s:g} s "
                f"(EVIDENCE_BODY_DEADLINE_S; {size} bytes read)",
            )
        if now >= window_end:
            if window_bytes < least:
                raise RequestRefused(
                    E.TOO_SLOW,
                    f"evidence upload below EVIDENCE_MIN_RATE_BPS ({timing.min_rate_bps:g} B/s): "
                    f"{window_bytes} bytes in the last {timing.window_s:g} s",
                )
            window_end, window_bytes = now + timing.window_s, 0
