"""The update exchange of one full-replication round: collect, report, and complete the agreed set.

1. **Collect.** Once the coordinator publishes the round's member list with each member's update
   header CID, the node gets every header (from gossip, else as a block by its CID) and every
   update (from its author first, then from every member), every block verified.
2. **Report.** It tells the coordinator whose updates it could not get (op ``collected``).
3. **Complete.** The coordinator decides one input set for everyone (``RoundInfo.agreed``). The
   node fetches what it still lacks of that set from every peer that may hold it. If it still
   cannot, it raises :class:`MissingUpdatesError` naming the members: it must not aggregate
   another set (that is how nodes diverged before).

See specs/training.md#a-round and specs/coordinator.md#agreement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog
import trio

from cnode.node.coordinator import RoundInfo
from cnode.node.p2p import FetchError, P2PError, P2PNode
from cnode.storage import CID, StorageError

from .. import limits
from .._exceptions import MissingUpdatesError, PeerUpdateError
from .._round import UpdateHeader, header_cid, open_update_header
from ..swarm import HeaderCollector, PeerFinder

__all__ = ["Collected", "UpdateExchange"]

log = structlog.get_logger(__name__)


@dataclass
class Collected:
    """What this node holds of a round: valid headers, and members whose header is invalid
    (the same bytes, hence the same verdict, on every node)."""

    headers: dict[str, tuple[CID, UpdateHeader]]
    invalid: dict[str, str]
    missing: dict[str, str]  # member -> why its header or update is not here


class UpdateExchange:
    """Fetches a round's updates for one node (see the module docstring)."""

    def __init__(
        self, run: str, me: str, node: P2PNode, headers: HeaderCollector, finder: PeerFinder
    ) -> None:
        self.run = run
        self.me = me
        self.node = node
        self.gossip = headers
        self.finder = finder
        self.refused_by: set[str] = set()  # holders that refused this node (banned?)
        self.bytes_in = 0  # verified update bytes fetched, all rounds (the round report's figure)

    async def collect(self, info: RoundInfo, *, until: float) -> Collected:
        """Get every listed member's header and update, until trio time ``until`` at the latest."""
        got = Collected({}, {}, {})
        with trio.move_on_at(until):
            await self.finder.dial_listed(info.addrs)
            self.finder.say_unreached(info.round, info.members, info.addrs)
            await self._wait_gossip(info)
        members = [m for m in info.members if m != self.me]
        with trio.move_on_at(until):
            async with trio.open_nursery() as nursery:
                for member in members:
                    nursery.start_soon(self._get_one, info, member, got, False)
        for member in members:
            if member not in got.headers and member not in got.invalid:
                got.missing.setdefault(member, "no fetch finished in time")
        return got

    async def complete(self, agreed: RoundInfo, got: Collected, *, until: float) -> Collected:
        """Fetch what this node lacks of the agreed set, from every member; raise
        :class:`MissingUpdatesError` if some of it cannot be had by trio time ``until``."""
        assert agreed.agreed is not None
        lacking = [m for m in agreed.agreed if m != self.me and m in got.missing]
        if lacking:
            log.info("fetching_agreed_updates", round=agreed.round, members=_short(lacking))
            with trio.move_on_at(until):
                await self.finder.dial_listed(agreed.addrs)
                async with trio.open_nursery() as nursery:
                    for member in lacking:
                        got.missing.pop(member, None)
                        nursery.start_soon(self._get_one, agreed, member, got, True)
        still = [m for m in agreed.agreed if m != self.me and m not in got.headers]
        still = [m for m in still if m not in got.invalid]
        if still:
            raise MissingUpdatesError(
                agreed.round,
                still,
                {m: got.missing.get(m, "no fetch finished in time") for m in still},
            )
        return got

    async def _wait_gossip(self, info: RoundInfo) -> None:
        """Headers were published before their senders said ready, so they are normally here
        already; wait a little for stragglers of the gossip mesh."""
        with trio.move_on_after(limits.HEADER_WAIT_S):
            while not all((info.round, m) in self.gossip.seen for m in info.headers):
                self.gossip.arrived = trio.Event()
                with trio.move_on_after(limits.HEADER_CHECK_S):
                    await self.gossip.arrived.wait()

    async def _get_one(self, info: RoundInfo, member: str, got: Collected, everyone: bool) -> None:
        """One member's header and update, with FETCH_ATTEMPTS tries: the first from the
        member (unless ``everyone``), the rest from every member that may hold the blocks."""
        want = info.headers.get(member)
        if want is None:
            got.missing[member] = "the round record lists no header for it"
            return
        cid = CID.parse(want)
        failure = "no attempt finished"
        for attempt in range(limits.FETCH_ATTEMPTS):
            holders = self.holders_for(info, member, everyone=everyone or attempt > 0)
            try:
                header = await self._header(info, member, cid, holders, got)
                if header is None:
                    return  # invalid: recorded in got.invalid
                report = await self.node.fetch(header.update, holders=holders)
                self.bytes_in += report.bytes
                got.headers[member] = (cid, header)
                got.missing.pop(member, None)
                return
            except FetchError as exc:
                self.refused_by |= exc.refused_by
                failure = str(exc)
            except (P2PError, StorageError) as exc:
                failure = str(exc)
            # Recorded now: when the phase's deadline cancels the next try, this is the reason.
            got.missing[member] = f"update not fetched: {failure}"
            log.info("update_fetch_retry", member=member[-8:], attempt=attempt, error=failure)
            await trio.sleep(limits.FETCH_RETRY_S * (attempt + 1))

    def holders_for(self, info: RoundInfo, member: str, *, everyone: bool) -> list[str]:
        """Whom to ask for ``member``'s blocks: the member, and with ``everyone`` every
        connected member too."""
        if not everyone:
            return [member]
        connected = set(self.node.connected_peers())
        return [member] + [p for p in info.members if p in connected and p not in (member, self.me)]

    async def fetch_header(
        self, info: RoundInfo, member: str, holders: Sequence[str]
    ) -> tuple[CID, UpdateHeader] | None:
        """``member``'s signed header as the round record names it, verified; None if invalid.
        Raises FetchError/P2PError when it cannot be had."""
        cid = CID.parse(info.headers[member])
        got = Collected({}, {}, {})
        header = await self._header(info, member, cid, holders, got)
        return None if header is None else (cid, header)

    async def _header(
        self, info: RoundInfo, member: str, cid: CID, holders: Sequence[str], got: Collected
    ) -> UpdateHeader | None:
        """The header the round record names for ``member``, verified; None if it is invalid
        (then ``got.invalid`` says why, the same on every node)."""
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
            got.invalid[member] = exc.reason
            got.missing.pop(member, None)
            return None
        return header


def _short(peers: Sequence[str]) -> list[str]:
    return [p[-8:] for p in peers]
