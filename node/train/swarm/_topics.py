"""The run's gossipsub topics as one node uses them: update headers in, own header out, and the
coordinator's signed state (bans at once). See specs/training.md#interaction.

Gossip is the fast path only. Every decision rests on the coordinator's signed round record:
a header missed on gossip is fetched as a block by the CID the record lists.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
import trio

from cnode.node.coordinator import BadRunState, RunState, run_state_topic, run_state_validator
from cnode.node.p2p import P2PNode

from .._round import UpdateHeader
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

    async def run_all(self, node: P2PNode, on_state: Callable[[RunState], None]) -> None:
        """Run every subscription until cancelled; each signed run state that arrives on
        gossip goes to ``on_state``."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._drain_headers, node)
            nursery.start_soon(self._follow_run_state, node, on_state)

    async def publish_header(self, node: P2PNode, envelope: bytes) -> None:
        """Publish the own header, once.

        Not repeated: a member that missed it fetches it by the CID the round record lists,
        one request, where every repeat cost every member a signature check per mesh copy
        (issue 41: repeats were half a 16-member swarm's gossip).
        """
        await node.publish(updates_topic(self.run), envelope)

    async def _drain_headers(self, node: P2PNode) -> None:
        async with node.subscribe(updates_topic(self.run), self.headers) as sub:
            async for opened in sub:
                # The validator recorded the header. It also says its signer holds the update
                # (specs/announce.md rule 3), so members do not announce updates apart.
                header = UpdateHeader.from_payload(opened.payload, opened.signer)
                node.note_holder(opened.signer, header.update)

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
