"""One full-replication round's exchange: collect, report, complete the agreed set, aggregate.

1. **Collect.** Once the coordinator publishes the round's member list with each member's update
   header CID, the node gets every header (from gossip, else as a block by its CID) and every
   update (from its author first, then from every member), every block verified.
2. **Report.** It tells the coordinator whose updates it could not get (op ``collected``).
3. **Complete.** The coordinator decides one input set for everyone (``RoundInfo.agreed``). The
   node fetches what it still lacks of that set from every peer that may hold it. If it still
   cannot, it raises :class:`MissingUpdatesError` naming the members: it must not aggregate
   another set (that is how nodes diverged before).
4. **Aggregate** exactly the agreed set (``NodeTrainer.aggregate``).

:meth:`UpdateExchange.play` runs the four, as ``PartitionedExchange.play`` runs a partitioned
round. See specs/training.md#a-round and specs/coordinator.md#agreement.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
import trio

from cnode.node.coordinator import CoordinatorClient, RoundInfo
from cnode.node.p2p import fetch_purpose
from cnode.storage import CID

from .. import limits
from .._exceptions import MissingUpdatesError, RoundStalledError
from .._round import UpdateHeader
from .._trainer import NodeTrainer, OwnUpdate, RoundOutcome
from ._fetch import MemberFetcher, with_retries

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
    """Plays the full-replication rounds of one node (see the module docstring)."""

    def __init__(
        self,
        trainer: NodeTrainer,
        client: CoordinatorClient,
        fetcher: MemberFetcher,
        *,
        collect_timeout_s: float,
        late_max_s: float,
    ) -> None:
        self.trainer = trainer
        self.client = client
        self.fetcher = fetcher
        # The run's rounds.collect_timeout_s: the agreed set gets no longer than this.
        self.collect_timeout_s = collect_timeout_s
        # The run's rounds.late_max_s: how long past the collect deadline the coordinator may
        # wait for members still fetching before it decides (specs/coordinator.md#pace).
        self.late_max_s = late_max_s
        self.last_fetch_s = 0.0  # the last round's collect and complete, for its report
        self.last_aggregate_s = 0.0

    async def play(
        self, info: RoundInfo, own: OwnUpdate, check_banned: Callable[[], Awaitable[None]]
    ) -> RoundOutcome:
        """Collect, report, complete and aggregate round ``info.round``; return the outcome.

        ``check_banned`` runs once the collect is over (the loop reads the signed state when a
        holder refused this node, and raises BannedError if it is banned). Raises
        MissingUpdatesError when the agreed set cannot be had: the node must catch up."""
        began = time.monotonic()
        headers, dropped = await self._agreed_inputs(info, own, check_banned)
        self.last_fetch_s = time.monotonic() - began
        self.trainer.check_agreement(
            info.round, {peer: header for peer, (_, header) in headers.items()}
        )
        began = time.monotonic()
        outcome = await trio.to_thread.run_sync(
            self.trainer.aggregate, info.round, headers, dropped
        )
        self.last_aggregate_s = time.monotonic() - began
        return outcome

    async def _agreed_inputs(
        self, info: RoundInfo, own: OwnUpdate, check_banned: Callable[[], Awaitable[None]]
    ) -> tuple[dict[str, tuple[CID, UpdateHeader]], dict[str, str]]:
        """Collect, report ``collected``, wait for the agreed set and complete it: the headers
        to aggregate and why each other member is left out."""
        round_, me = info.round, self.fetcher.me
        deadline_s = (info.collect_deadline_ms or 0) / 1000 - time.time()
        fetch_s = min(limits.ROUND_FETCH_S, deadline_s - limits.COLLECT_REPORT_MARGIN_S)
        got = await self.collect(info, until=trio.current_time() + max(fetch_s, 1.0))
        await check_banned()  # before anything else: a banned node says so
        await self.client.collected(round_, missing=sorted(got.missing))
        agreed: RoundInfo | None = None
        slack = self.late_max_s + limits.AGREED_WAIT_SLACK_S
        with trio.move_on_after(max(deadline_s, 0.0) + slack):
            agreed = await self.client.wait_agreed(round_)
        if agreed is None or agreed.agreed is None:
            raise RoundStalledError(
                f"round {round_}: no agreed input set {slack:g} s after the round's collect "
                "deadline"
            )
        until = trio.current_time() + min(limits.AGREED_FETCH_S, self.collect_timeout_s)
        got = await self.complete(agreed, got, until=until)
        headers = {m: got.headers[m] for m in agreed.agreed if m in got.headers}
        if me in agreed.agreed:
            headers[me] = (own.header_cid, own.header)
        dropped = dict(agreed.excluded)
        dropped.update({m: why for m, why in got.invalid.items() if m in agreed.agreed})
        if dropped:
            log.warning(
                "round_aggregates_fewer_members",
                round=round_,
                listed=len(info.members),
                aggregated=len(headers),
                left_out={peer[-8:]: why for peer, why in dropped.items()},
            )
        return headers, dropped

    async def collect(self, info: RoundInfo, *, until: float) -> Collected:
        """Get every listed member's header and update, until trio time ``until`` at the latest."""
        got = Collected({}, {}, {})
        with trio.move_on_at(until):
            await self.fetcher.finder.dial_listed(info.addrs)
            self.fetcher.finder.say_unreached(info.round, info.members, info.addrs)
            await self._wait_gossip(info)
        members = [m for m in info.members if m != self.fetcher.me]
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
        me = self.fetcher.me
        lacking = [m for m in agreed.agreed if m != me and m in got.missing]
        if lacking:
            log.info("fetching_agreed_updates", round=agreed.round, members=_short(lacking))
            with trio.move_on_at(until):
                await self.fetcher.finder.dial_listed(agreed.addrs)
                async with trio.open_nursery() as nursery:
                    for member in lacking:
                        got.missing.pop(member, None)
                        nursery.start_soon(self._get_one, agreed, member, got, True)
        still = [m for m in agreed.agreed if m != me and m not in got.headers]
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
        gossip = self.fetcher.gossip
        with trio.move_on_after(limits.HEADER_WAIT_S):
            while not all((info.round, m) in gossip.seen for m in info.headers):
                gossip.arrived = trio.Event()
                with trio.move_on_after(limits.HEADER_CHECK_S):
                    await gossip.arrived.wait()

    async def _get_one(self, info: RoundInfo, member: str, got: Collected, everyone: bool) -> None:
        """One member's header and update, with FETCH_ATTEMPTS tries: the first from the
        member (unless ``everyone``), the rest from every member that may hold the blocks."""
        if member not in info.headers:
            got.missing[member] = "the round record lists no header for it"
            return
        fetcher = self.fetcher

        async def attempt(i: int) -> None:
            holders = fetcher.holders_for(info, member, everyone=everyone or i > 0)
            with fetch_purpose("full"):
                header = await fetcher.fetch_header(info, member, holders, got.invalid)
                if header is None:
                    got.missing.pop(member, None)
                    return  # invalid: recorded in got.invalid
                report = await fetcher.node.fetch(header[1].update, holders=holders)
            fetcher.bytes_in += report.bytes
            got.headers[member] = header
            got.missing.pop(member, None)

        def failed(i: int, why: str) -> None:
            got.missing[member] = f"update not fetched: {why}"
            log.info("update_fetch_retry", member=member[-8:], attempt=i, error=why)

        await with_retries(
            attempt,
            refused_by=fetcher.refused_by,
            failed=failed,
            attempts=fetcher.attempts_for(info, member),
        )


def _short(peers: Sequence[str]) -> list[str]:
    return [p[-8:] for p in peers]
