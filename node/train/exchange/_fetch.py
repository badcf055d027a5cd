"""Fetching from a round's members, for every stage of either kind of round: whom to ask, a
member's signed header as the round record names it, the one retry loop, and what a partitioned
round fetches of an update (the manifest and one partition's segments; shared by the aggregator,
the verifier and ``bench/round.py``, specs/training.md#partitioned-rounds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import structlog
import trio

from cnode.node.coordinator import RoundInfo
from cnode.node.p2p import FetchError, P2PError, P2PNode
from cnode.storage import CID, StorageError

from .. import limits
from .._exceptions import PeerUpdateError
from .._round import UpdateHeader, header_cid, open_update_header, segment_layer
from ..swarm import HeaderCollector, PeerFinder

__all__ = ["GaveUp", "MemberFetcher", "fetch_update_segments", "with_retries"]

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class GaveUp:
    """Every attempt of :func:`with_retries` failed; ``why`` is the last one's error."""

    why: str


async def with_retries(
    attempt: Callable[[int], Awaitable[T]],
    *,
    refused_by: set[str],
    failed: Callable[[int, str], None] | None = None,
    attempts: int = limits.FETCH_ATTEMPTS,
) -> T | GaveUp:
    """``attempt(i)`` for i in 0..FETCH_ATTEMPTS-1 until one returns, sleeping FETCH_RETRY_S x
    (i + 1) after each failure (a FetchError, P2PError or StorageError); GaveUp after the last.

    ``refused_by`` gathers the holders that refused this node (a ban it has not heard of yet?:
    the round loop reads the signed state when it is not empty). ``failed(i, why)`` runs after
    each failure, before the sleep: when the caller's deadline cancels the sleep, what it
    recorded is the reason.
    """
    why = "no attempt finished"
    for i in range(attempts):
        try:
            return await attempt(i)
        except FetchError as exc:
            refused_by |= exc.refused_by
            why = str(exc)
        except (P2PError, StorageError) as exc:
            why = str(exc)
        if failed is not None:
            failed(i, why)
        await trio.sleep(limits.FETCH_RETRY_S * (i + 1))
    return GaveUp(why)


class MemberFetcher:
    """What every stage of one node fetches from a round's members: whom to ask and the signed
    headers the round record names. Holds the holders that refused this node (``refused_by``,
    filled by :func:`with_retries`) and the verified update bytes of full rounds (``bytes_in``)."""

    def __init__(
        self, run: str, me: str, node: P2PNode, gossip: HeaderCollector, finder: PeerFinder
    ) -> None:
        self.run = run
        self.me = me
        self.node = node
        self.gossip = gossip
        self.finder = finder
        self.refused_by: set[str] = set()  # holders that refused this node (banned?)
        self.bytes_in = 0  # verified update bytes fetched in full rounds (the round report's)

    def relayed(self, info: RoundInfo, member: str) -> bool:
        """Whether ``member``'s blocks reach this node only through holders that re-serve them:
        it is outbound-only (listed without an address) and has no connection to us (issue 37,
        specs/blocks.md#reachability)."""
        return not info.addrs.get(member) and not self.node.is_connected(member)

    def attempts_for(self, info: RoundInfo, member: str) -> int:
        """Tries to fetch ``member``'s update: more for a relayed one, whose re-serving holder
        fetches it from its author meanwhile."""
        if self.relayed(info, member):
            return limits.RELAYED_FETCH_ATTEMPTS
        return limits.FETCH_ATTEMPTS

    def holders_for(self, info: RoundInfo, member: str, *, everyone: bool) -> list[str]:
        """Whom to ask for ``member``'s blocks: the member, and with ``everyone`` (or when the
        member is relayed: see :meth:`relayed`) every connected member too."""
        if not everyone and not self.relayed(info, member):
            return [member]
        connected = set(self.node.connected_peers())
        return [member] + [p for p in info.members if p in connected and p not in (member, self.me)]

    async def fetch_header(
        self,
        info: RoundInfo,
        member: str,
        holders: Sequence[str],
        invalid: dict[str, str] | None = None,
    ) -> tuple[CID, UpdateHeader] | None:
        """``member``'s signed header as the round record names it, verified; None if it is
        invalid (then ``invalid[member]`` says why, the same on every node). Raises
        FetchError/P2PError/StorageError when it cannot be had."""
        cid = CID.parse(info.headers[member])
        store = self.node.store
        seen = self.gossip.seen.get((info.round, member))
        if not store.has(cid):
            if seen is not None and header_cid(seen[0]) == cid:
                store.put(cid, seen[0])
            else:
                # Not on gossip, or another header than the one it told the coordinator about:
                # the recorded CID is what counts.
                await self.node.fetch_blocks([cid], holders=holders)
        envelope = store.get(cid)
        try:
            header = open_update_header(envelope, run=self.run, round_=info.round, signer=member)
        except PeerUpdateError as exc:
            log.warning("invalid_update_header", member=member[-8:], reason=exc.reason)
            if invalid is not None:
                invalid[member] = exc.reason
            return None
        return cid, header


async def fetch_update_segments(
    node: P2PNode, update: CID, indices: Sequence[int], holders: Sequence[str]
) -> int:
    """Fetch the manifest nodes of ``update`` and the chunks of its segments ``indices``: only
    what a partition needs, every block verified. Returns the bytes fetched.

    One fetch, one pass over the manifest (``P2PNode.fetch`` with ``layers``): each node is
    parsed once, from the bytes received (or read once if held), and what it lists joins the
    fetch's queue as it arrives; no walk of the whole manifest per level, no fetch per level.
    A node that breaks the manifest schema raises ManifestError (a StorageError).
    """
    names = [segment_layer(i) for i in indices]
    return (await node.fetch(update, holders, layers=names)).bytes
