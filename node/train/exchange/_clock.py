"""Seconds per stage of a round, for the round report (specs/training.md#reports)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Clock"]

T = TypeVar("T")


class Clock:
    """Seconds per stage of one round into ``phases``: each lap is the time since the last."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.began = phases, time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self.began, 4)
        self.began = now

    async def timed(self, name: str, fn: Callable[[T], Awaitable[None]], arg: T) -> None:
        began = time.monotonic()
        await fn(arg)
        self.phases[name] = round(time.monotonic() - began, 4)
