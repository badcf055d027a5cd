"""Publishing the signed run state on the run's gossipsub topic (specs/coordinator.md#state-gossip).

The coordinator is asyncio (aiohttp); py-libp2p is trio. :class:`StateGossip` runs a libp2p node
in a trio thread through ``cnode.node.p2p.trio_portal`` (the project's one bridge pattern) and
publishes the latest signed state, coalesced to at most one message per GOSSIP_MIN_INTERVAL_S and
repeated every GOSSIP_REPUBLISH_S so late subscribers learn it without polling.

Nodes subscribe with :func:`run_state_validator`: a state counts only when signed by the pinned
coordinator, for this run, and not older than one already accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from cnode.auth import Identity, Opened
from cnode.node.p2p import (
    EnvelopeValidator,
    P2PError,
    P2PNode,
    P2PSettings,
    TrioPortal,
    open_p2p_node,
    trio_portal,
)
from cnode.node.p2p import limits as p2p_limits
from cnode.storage import BlockStore

from . import limits
from ._wire._protocol import STATE_TYPE, ViewKind

__all__ = ["StateGossip", "run_state_topic", "run_state_validator"]

log = structlog.get_logger(__name__)


def run_state_topic(run: str) -> str:
    """The gossipsub topic on which run ``run``'s coordinator publishes its signed state."""
    return f"/cnode/run/{run}/state/1"


def run_state_validator(run: str, coordinator: str) -> EnvelopeValidator:
    """Validator for :func:`run_state_topic`: pinned signer, this run, version never going back."""
    highest = [0]

    def check(opened: Opened) -> str | None:
        p = opened.payload
        if p.get("kind") != ViewKind.RUN or p.get("run") != run:
            return "not a run state of this run"
        version = p.get("version")
        if type(version) is not int or version < highest[0]:
            return "run state older than one already accepted"
        highest[0] = version
        return None

    return EnvelopeValidator(STATE_TYPE, allow=lambda signer: signer == coordinator, check=check)


class StateGossip:
    """``async with StateGossip(identity, run, settings, blocks_dir) as gossip`` (asyncio side).

    ``gossip.addrs``: the node's listen multiaddrs (put in the run state);
    ``gossip.changed(signed_state)``: a newer state exists (never blocks, never signs).

    Resource handling: leaving the block cancels the publisher task and stops the trio thread.
    Error handling: a failed publish is logged and retried with the next state or republish.
    """

    def __init__(
        self, identity: Identity, run: str, settings: P2PSettings, blocks_dir: Path
    ) -> None:
        self.identity = identity
        self.topic = run_state_topic(run)
        self.settings = settings
        self.blocks_dir = blocks_dir
        self.addrs: list[str] = []
        self._make: Callable[[], bytes] | None = None
        self._changed = asyncio.Event()
        self._portal_cm: AbstractAsyncContextManager[TrioPortal[P2PNode]] | None = None
        self._portal: TrioPortal[P2PNode] | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StateGossip:
        store = BlockStore(self.blocks_dir)  # empty: the coordinator never holds model data

        def factory() -> AbstractAsyncContextManager[P2PNode]:
            # Nobody fetches blocks from the coordinator; it only publishes.
            return open_p2p_node(self.identity, store, self.settings, allow=lambda _peer: False)

        self._portal_cm = trio_portal(factory)
        self._portal = await self._portal_cm.__aenter__()
        self.addrs = list(self._portal.value.listen_addrs)
        self._task = asyncio.create_task(self._publisher())  # owned: cancelled in __aexit__
        log.info("state_gossip_started", topic=self.topic, addrs=self.addrs)
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._portal_cm is not None:
            await self._portal_cm.__aexit__(t, e, tb)

    def changed(self, signed_state: Callable[[], bytes]) -> None:
        """The state changed; ``signed_state()`` gives the latest signed state when called.

        It is called only when a message actually goes out (at most every
        GOSSIP_MIN_INTERVAL_S): signing a state with a thousand members costs tens of ms, so a
        burst of changes must not sign each one.
        """
        self._make = signed_state
        self._changed.set()

    async def _publisher(self) -> None:
        assert self._portal is not None
        node: Any = self._portal.value
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), limits.GOSSIP_REPUBLISH_S)
            self._changed.clear()
            data = self._make() if self._make is not None else None
            if data is not None and len(data) > p2p_limits.MAX_ANNOUNCEMENT_SIZE:
                log.warning("run_state_too_big_to_gossip", size=len(data))
            elif data is not None:
                try:
                    await self._portal.call(node.publish, self.topic, data)
                except P2PError as exc:
                    log.warning("run_state_publish_failed", error=str(exc))
            await asyncio.sleep(limits.GOSSIP_MIN_INTERVAL_S)
