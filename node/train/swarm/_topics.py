"""The run's gossipsub topics as one node uses them: update headers in, own header out, and the
coordinator's signed state (bans at once). See specs/training.md#interaction.

Gossip is the fast path only. Every decision rests on the coordinator's signed round record:
a header missed on gossip is fetched as a block by the CID the record lists.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
import trio

from cnode.node.coordinator import BadRunState, RunState, run_state_topic, run_state_validator
from cnode.node.p2p import P2PError, P2PNode

from .. import limits
from ._headers import HeaderCollector

__all__ = ["RunTopics", "updates_topic"]

log = structlog.get_logger(__name__)


def updates_topic(run: str) -> str:
    """The gossipsub topic that carries a run's signed update headers."""
    return f"cnode/{run}/updates/1"


class RunTopics:
    """Subscriptions and publications of one node on its run's topics."""

    def __init__(
        self,
        run: str,
        coordinator: str,
        headers: HeaderCollector,
    ) -> None:
        self.run = run
        self.coordinator = coordinator
        self.headers = headers
        # The own header's repeats: the envelope, when the next is due and the gap after it
        # (doubling), and when they end (monotonic seconds).
        self._own: tuple[bytes, float, float, float] | None = None

    async def run_all(self, node: P2PNode, on_state: Callable[[RunState], None]) -> None:
        """Run every subscription and the republisher until cancelled; each signed run state
        that arrives on gossip goes to ``on_state``."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._drain_headers, node)
            nursery.start_soon(self._republish_headers, node)
            nursery.start_soon(self._follow_run_state, node, on_state)

    async def publish_header(self, node: P2PNode, envelope: bytes) -> None:
        await node.publish(updates_topic(self.run), envelope)
        now, gap = time.monotonic(), limits.HEADER_REPUBLISH_S
        self._own = (envelope, now + gap, gap, now + limits.HEADER_REPUBLISH_FOR_S)

    async def _drain_headers(self, node: P2PNode) -> None:
        async with node.subscribe(updates_topic(self.run), self.headers) as sub:
            async for _ in sub:
                pass  # the validator already recorded the header

    async def _republish_headers(self, node: P2PNode) -> None:
        """Publish the latest own header again HEADER_REPUBLISH_S after the first publish,
        then at doubling gaps (1, 2, 4, 8, 16 s after it) until HEADER_REPUBLISH_FOR_S.

        Gossipsub delivers only to peers already in the topic's mesh; a member that (re)joined
        moments before would miss the single publish. Every repeat is verified by every
        receiver, so they thin out as the mesh settles: a repeat each second was a fifth of a
        16-member swarm's gossip (issue 41).
        """
        while True:
            await trio.sleep(limits.HEADER_REPUBLISH_S)
            if self._own is None:
                continue
            envelope, due, gap, until = self._own
            now = time.monotonic()
            if now < due or now > until:
                continue
            self._own = (envelope, now + 2 * gap, 2 * gap, until)
            try:
                await node.publish(updates_topic(self.run), envelope)
            except P2PError as exc:
                log.info("header_republish_failed", error=str(exc))

    async def _follow_run_state(self, node: P2PNode, on_state: Callable[[RunState], None]) -> None:
        """Take the coordinator's signed state from gossip as soon as it publishes it.

        Polling (PeerFinder) would see a ban within DISCOVERY_POLL_S; over gossip it stops a
        banned peer's block requests and headers at once. A state counts only when signed by
        the pinned coordinator (the topic validator checks it).
        """
        validator = run_state_validator(self.run, self.coordinator)
        async with node.subscribe(run_state_topic(self.run), validator) as states:
            async for opened in states:
                try:
                    state = RunState.from_payload(opened.payload)
                except BadRunState as exc:  # signed, yet malformed: ignore it, polling goes on
                    log.warning("bad_run_state_on_gossip", error=str(exc))
                    continue
                on_state(state)
