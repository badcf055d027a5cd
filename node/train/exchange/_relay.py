"""Public members re-serve the updates of outbound-only ones (issue 37).

An outbound-only member (behind NAT: the coordinator could not dial it back) connects to every
public member, and they fetch from it over those connections; but two outbound-only members can
never connect to each other. So, as soon as a round's member list is out, each outbound-only
member's whole update is fetched by one public member (its **re-serving holder**: the public
members in peer-id order take the outbound-only ones in turn), which then serves it like any
block it holds. Every block is verified by its CID, so a re-serving holder cannot forge a byte;
it can only fail to serve, and then the fetch goes on with the other holders and retries.

Outbound-only members fetch an outbound-only member's blocks from every member they are
connected to (``MemberFetcher.holders_for``), with more tries (``RELAYED_FETCH_ATTEMPTS``) while
the re-serving holder fetches them. Who pays: the re-serving holder's download and upload of
about one update per outbound-only member it re-serves, per round (specs/blocks.md#reachability).
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
import trio

from cnode.node.coordinator import RoundInfo
from cnode.node.p2p import fetch_purpose

from ._fetch import GaveUp, MemberFetcher, with_retries

__all__ = ["Relay", "relay_duty"]

log = structlog.get_logger(__name__)


def relay_duty(members: Sequence[str], addrs: dict[str, list[str]], me: str) -> list[str]:
    """The outbound-only members whose updates ``me`` re-serves (none unless ``me`` is public):
    the outbound-only members in peer-id order, dealt to the public members in peer-id order."""
    public = sorted(m for m in members if addrs.get(m))
    if me not in public:
        return []
    outbound = sorted(m for m in members if not addrs.get(m))
    return [m for i, m in enumerate(outbound) if public[i % len(public)] == me]


class Relay:
    """This node's re-serving duty in each round; ``last_bytes``: what it fetched for it."""

    def __init__(self, fetcher: MemberFetcher) -> None:
        self.fetcher = fetcher
        self.last_bytes = 0
        self.last_members: list[str] = []

    async def run(self, info: RoundInfo) -> None:
        """Fetch the whole update of every outbound-only member this node re-serves in the
        round ``info`` lists (until done, or cancelled with the round)."""
        duty = [
            m
            for m in relay_duty(info.members, dict(info.addrs), self.fetcher.me)
            if m in info.headers
        ]
        self.last_bytes, self.last_members = 0, duty
        if not duty:
            return
        async with trio.open_nursery() as nursery:
            for member in duty:
                nursery.start_soon(self._fetch, info, member)
        log.info("updates_reserved", round=info.round, members=len(duty), bytes=self.last_bytes)

    async def _fetch(self, info: RoundInfo, member: str) -> None:
        fetcher = self.fetcher

        async def attempt(_: int) -> None:
            with fetch_purpose("relay"):
                header = await fetcher.fetch_header(info, member, [member])
                if header is None:
                    return  # invalid: every node finds it so on its own
                report = await fetcher.node.fetch(header[1].update, holders=[member])
            self.last_bytes += report.bytes

        got = await with_retries(attempt, refused_by=fetcher.refused_by)
        if isinstance(got, GaveUp):
            log.info("update_not_reserved", round=info.round, member=member[-8:], why=got.why)
