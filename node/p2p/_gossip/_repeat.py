"""When a node says again what it holds (specs/announce.md, rule 2).

Gossipsub keeps no history: a peer that subscribes after a ``hold`` was published never hears
it. Repeating every hold on a fixed timer for everyone's sake was the swarm's largest source of
gossip at 16 members (issue 41: each repeat is verified by every receiver, several times over
the mesh). So the repeats follow the reason for them: a node repeats its holds when the run's
topic has gained a subscriber since its last repeat (checked every REANNOUNCE_CHECK_S), and
otherwise only every REANNOUNCE_HOLD_S, the safety net for a message gossip lost.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Collection, Iterator

import trio

from cnode.storage import CID

from .. import limits

Layers = tuple[str, ...] | None


class HeldManifests:
    """The manifests a node announced with ``hold`` (the MAX_REANNOUNCED_HOLDS latest), and
    the topic subscribers it has told about them."""

    def __init__(self) -> None:
        self._held: collections.OrderedDict[CID, Layers] = collections.OrderedDict()
        self._told: set[str] = set()  # topic subscribers at the last repeat
        self._next_sweep = 0.0

    def add(self, root: CID, layers: Layers) -> None:
        self._held[root] = layers
        self._held.move_to_end(root)
        while len(self._held) > limits.MAX_REANNOUNCED_HOLDS:
            self._held.popitem(last=False)

    def discard(self, root: CID) -> None:
        self._held.pop(root, None)

    def clear(self) -> None:
        self._held.clear()

    def __iter__(self) -> Iterator[tuple[CID, Layers]]:
        return iter(list(self._held.items()))

    def due(self, subscribers: Collection[str], now: float) -> bool:
        """Whether to repeat now: a subscriber joined since the last repeat (one that left and
        came back counts as new), or REANNOUNCE_HOLD_S have passed."""
        joined = not set(subscribers) <= self._told
        self._told &= set(subscribers)  # forget those who left: their return is a join
        if not (joined or now >= self._next_sweep):
            return False
        self._told = set(subscribers)
        self._next_sweep = now + limits.REANNOUNCE_HOLD_S
        return True


async def repeat_holds(
    held: HeldManifests,
    subscribers: Callable[[], Collection[str]],
    sweep: Callable[[], Awaitable[None]],
) -> None:
    """Run ``sweep`` (re-announce every held manifest) whenever ``held.due``; until cancelled."""
    while True:
        await trio.sleep(limits.REANNOUNCE_CHECK_S)
        if held.due(subscribers(), trio.current_time()):
            await sweep()
