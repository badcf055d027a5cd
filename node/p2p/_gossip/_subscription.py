"""A subscription to one gossip topic: validated messages as an async iterator."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

import structlog
import trio

from cnode.auth import Opened

from .. import limits
from ._announce import EnvelopeValidator

__all__ = ["Subscription"]

log = structlog.get_logger(__name__)


class _Topics(Protocol):
    """What a subscription needs of its node (``P2PNode``): joining and leaving its topic."""

    async def _join(self, sub: Subscription) -> None: ...

    def _leave(self, sub: Subscription) -> None: ...


class Subscription:
    """Validated messages of one topic, as an async iterator (and async context manager)."""

    def __init__(self, node: _Topics, topic: str, validator: EnvelopeValidator) -> None:
        self._node = node
        self.topic = topic
        self.validator = validator
        self._send, self._recv = trio.open_memory_channel[Opened](limits.SUBSCRIBER_BUFFER)
        self.dropped = 0
        self._joined = False

    async def _join(self) -> None:
        if not self._joined:
            self._joined = True
            await self._node._join(self)

    async def __aenter__(self) -> Subscription:
        await self._join()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._node._leave(self)
        self._send.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Opened:
        await self._join()
        try:
            return await self._recv.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def _deliver(self, opened: Opened) -> None:
        try:
            self._send.send_nowait(opened)
        except trio.WouldBlock:
            self.dropped += 1
            log.warning("subscriber_too_slow", topic=self.topic, dropped=self.dropped)
        except trio.ClosedResourceError:
            pass
