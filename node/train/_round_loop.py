"""The round loop of one node: join, train, publish, exchange, aggregate, checkpoint.

Each stage has its own module; this one only sequences them (specs/training.md#a-round):

- join: the coordinator places the node in a round (``client.join_round``); a node behind the
  swarm first catches up (``_catch_up``);
- train and publish: the trainer stores the update and its signed header; the header goes out
  on gossip (``_topics``) and its CID in ``ready``;
- exchange and aggregate: a full round's collect, ``collected`` report, agreed input set and
  aggregation (``exchange.UpdateExchange.play``), or a partitioned round's aggregate, score,
  verify and assemble (``exchange.PartitionedExchange.play``);
- then the checkpoint and its agreement check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import structlog
import trio

from cnode.aggregation import BanRecommendation
from cnode.node._logging import bind_context
from cnode.node.coordinator import (
    CoordinatorClient,
    CoordinatorRejected,
    ErrorCode,
    RoundInfo,
    RunState,
)
from cnode.node.p2p import P2PNode
from cnode.storage import CID

from . import limits
from ._catch_up import CatchUp
from ._exceptions import (
    CatchUpError,
    MissingUpdatesError,
    OutputsUnavailableError,
    RoundStalledError,
)
from ._report import Event, Reporter
from ._trainer import NodeTrainer, OwnUpdate, RoundOutcome
from .checkpoint import agree_on_checkpoint
from .exchange import PartitionedExchange, Relay, UpdateExchange
from .swarm import (
    HeaderCollector,
    KnownBans,
    RunTopics,
    catch_up_report,
    check_round_reachable,
    leave_round,
    note_reachability,
    round_report,
    send_report,
)

__all__ = ["RoundLoop"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _TrafficMark:
    """A node's traffic counters at the start of a round's exchange."""

    served: int  # block bytes served
    update_bytes: int  # verified update bytes fetched (full rounds)
    block_bytes: int  # every verified block byte fetched


@dataclass
class RoundLoop:
    """Plays rounds until ``stop_after_round`` (0 = forever)."""

    run_id: str
    trainer: NodeTrainer
    reporter: Reporter
    client: CoordinatorClient
    node: P2PNode
    topics: RunTopics
    exchange: UpdateExchange
    partitioned: PartitionedExchange
    headers: HeaderCollector
    catch_up: CatchUp
    bans: KnownBans
    every: int  # checkpoint every this many rounds
    stop_after_round: int
    checkpointer: bool
    current_round: int | None = None  # joined and not yet aggregated
    gave_up: MissingUpdatesError | None = None  # the last round this node could not complete
    relay: Relay = field(init=False)  # its re-serving of outbound-only members' updates
    cpu_mark: float = field(init=False)  # process CPU seconds at the last round event

    def __post_init__(self) -> None:
        self.relay = Relay(self.exchange.fetcher)
        self.cpu_mark = time.process_time()

    async def run(self) -> None:
        await self._resume_from_store()
        while not await self.one_round():
            pass

    async def _resume_from_store(self) -> None:
        """A restarted node takes its own latest checkpoint, if it has one."""
        pinned = self.trainer.store.pins().get(self.trainer.pin_name)
        if pinned is not None:
            await trio.to_thread.run_sync(self.trainer.resume_checkpoint, pinned)
            self.reporter.event(Event.RESUMED, round=self.trainer.round, manifest=str(pinned))

    async def one_round(self) -> bool:
        """Play one round; True when the node is done."""
        round_ = await self._enter_round()
        if round_ is None:
            return True
        if (published := await self._publish_in_time(round_)) is None:
            return False
        own, t_train, t_publish = published
        published_at = time.time()  # wall clock: compared across nodes (bench/round.py)
        if not self._listed_as_own(info := await self._wait_members(round_), own):
            return False
        check_round_reachable(round_, self.node.peer_id, info.members, info.addrs)
        note_reachability(self.node, info.members, info.addrs)
        mark = self._traffic_mark()
        began = time.monotonic()
        outcome = await self._exchange(info, own)
        if outcome is None:
            self.current_round = None  # the next round starts with a catch-up
            return False
        assembled_at = time.time()
        split: dict[str, object] = {}
        if info.parts:
            split = {
                "phases": self.partitioned.last_phases,
                "bytes_in_by": self.partitioned.last_bytes,
            }
            t_fetch, t_aggregate = time.monotonic() - began, 0.0
            bytes_in = self.partitioned.last_bytes_in
        else:
            t_fetch, t_aggregate = self.exchange.last_fetch_s, self.exchange.last_aggregate_s
            bytes_in = self.exchange.fetcher.bytes_in - mark.update_bytes
        self.gave_up = None
        self.headers.forget_before(round_)  # this round's headers are in the store now
        self.current_round = None
        last = bool(self.stop_after_round) and round_ >= self.stop_after_round
        if not last:
            # Join the next round now: its list closes when its first member is ready, and a
            # node that joins after that waits a whole round (DISCO's rule for late comers).
            self.current_round = await self.client.join_round()
        manifest = None
        if outcome.empty:  # warned once (round_exchanged_nothing): no progress to checkpoint
            self.reporter.event(Event.ROUND_EXCHANGED_NOTHING, round=round_, parts=info.parts)
        elif round_ % self.every == 0:
            manifest = await trio.to_thread.run_sync(self.trainer.store_checkpoint)
            # No `hold` on gossip: every member stores these same bytes, the round report
            # (`holds`) tells the coordinator, and a joiner asks every member the state lists.
            # n members announcing one CID cost each member n x D messages a round (issue 41).
            await self._agree(round_, info.epoch, manifest)
        for ban in outcome.bans:
            await self._report_ban(ban)
        loss = await trio.to_thread.run_sync(self.trainer.evaluate)
        self.reporter.event(
            Event.ROUND,
            round=round_,
            loss=loss,
            state_cid=str(self.trainer.state_cid),
            manifest=None if manifest is None else str(manifest),
            members=list(outcome.members),
            dropped=outcome.dropped,
            local_loss=[own.local.loss_first, own.local.loss_last],
            train_s=t_train,
            publish_s=t_publish,
            fetch_s=t_fetch,
            aggregate_s=t_aggregate,
            parts=info.parts,
            **self._traffic_since(mark, bytes_in),
            # When this node's header was out and when its new state was assembled (wall
            # clock): the round's overhead is the latter minus the last member's former.
            published_at=published_at,
            assembled_at=assembled_at,
            # Bytes this node fetched to re-serve outbound-only members' updates (issue 37).
            reserved_bytes=self.relay.last_bytes,
            cpu_s=self._cpu_lap(),
            **split,
        )
        holds = None if manifest is None else str(manifest)
        report = round_report(round_, loss, str(self.trainer.state_cid), holds)
        await send_report(self.client, report)
        return last

    def _traffic_mark(self) -> _TrafficMark:
        fetched = sum(self.node.traffic.bytes_in.values())
        return _TrafficMark(self.node.server.bytes_sent, self.exchange.fetcher.bytes_in, fetched)

    def _traffic_since(self, mark: _TrafficMark, bytes_in: int) -> dict[str, int]:
        """The round event's traffic since ``mark``, in the round's exchange (a catch-up's is in
        its own event): ``bytes_in``, the verified update bytes fetched (the demo report's
        traffic table); ``blocks_in``, every verified block byte fetched, the manifest roots
        and signed records that name those bytes included; ``bytes_out``, block bytes served."""
        return {
            "bytes_in": bytes_in,
            "blocks_in": sum(self.node.traffic.bytes_in.values()) - mark.block_bytes,
            "bytes_out": self.node.server.bytes_sent - mark.served,
        }

    def _cpu_lap(self) -> float:
        """This process's CPU seconds (every thread) since the last round event: what one
        member's round costs, the figure that carries to one member per machine."""
        now = time.process_time()
        lap, self.cpu_mark = now - self.cpu_mark, now
        return round(lap, 3)

    async def _exchange(self, info: RoundInfo, own: OwnUpdate) -> RoundOutcome | None:
        """The round's exchange (partitioned or full), with this node's re-serving of
        outbound-only members' updates beside it (exchange/_relay.py)."""
        async with trio.open_nursery() as relaying:
            relaying.start_soon(self.relay.run, info)
            outcome = await (
                self._play_partitioned(info) if info.parts else self._play_full(info, own)
            )
            relaying.cancel_scope.cancel()
        return outcome

    async def _publish_in_time(self, round_: int) -> tuple[OwnUpdate, float, float] | None:
        """``_train_and_publish``, or None when the round closed before this node was ready."""
        try:
            return await self._train_and_publish(round_)
        except CoordinatorRejected as exc:
            if exc.code is not ErrorCode.ROUND_OVER:
                raise
            # Its update came after the round closed (a slow node, one whose ready an outage
            # of the coordinator held back, or one restarted within the round it had joined):
            # the round goes on without it, and so does this node, from the next round's
            # catch-up, as a member dropped at the deadline would.
            self._sit_out(round_, {"own": f"ready after the round closed: {exc.message}"})
            return None

    def _listed_as_own(self, info: RoundInfo, own: OwnUpdate) -> bool:
        """Whether the round lists this node's update as the one it just published (or none)."""
        listed = info.headers.get(self.node.peer_id, str(own.header_cid))
        if listed == str(own.header_cid):
            return True
        # A restart landed it in a round it had published another update in, before it was
        # killed: the coordinator keeps a member's first header, so that is the update the
        # others use. This process cannot rebuild it (its residual was replaced when it was
        # made), and aggregating its new one would diverge: it sits the round out and catches
        # up at the next (specs/training.md, "A restart within a round").
        self._sit_out(
            info.round, {"own": f"the round lists its update of before a restart, {listed}"}
        )
        return False

    def _sit_out(self, round_: int, missing: dict[str, str]) -> None:
        """Play no further part in ``round_``: the next round starts with a catch-up."""
        log.warning("round_given_up", round=round_, missing=missing)
        self.reporter.event(Event.ROUND_GIVEN_UP, round=round_, missing=missing)
        self.current_round = None

    async def _enter_round(self) -> int | None:
        """The round this node plays next, caught up to it first if it is behind; None when
        the rounds it was asked for are over (it left the round it had joined)."""
        client, stop = self.client, self.stop_after_round
        # Normally joined at the end of the previous round already (see one_round).
        round_ = self.current_round or await client.join_round()
        self.current_round = round_
        self.headers.forget_before(round_ - 1)  # a joiner's window starts at its first round
        bind_context(round=round_)
        if stop and round_ > stop:
            await leave_round(client, round_)  # joined too late for the rounds it was asked for
            if self.gave_up is not None:  # and it never caught up with the swarm's state
                raise CatchUpError(
                    f"{self.gave_up}; the run passed round {stop} before this node caught up"
                )
            return None
        if round_ != self.trainer.round + 1:
            round_ = self.current_round = await self._catch_up(round_)
            caught = self.reporter.last.pop(Event.CAUGHT_UP, None)
            if caught is not None:  # for the dashboard's late-joiner table
                await send_report(client, catch_up_report(caught))
            if stop and round_ > stop:
                await leave_round(client, round_)
                return None
        return round_

    async def _train_and_publish(self, round_: int) -> tuple[OwnUpdate, float, float]:
        """Train and store this node's update, publish its header and say ready;
        the update, and the seconds training and publishing took."""
        began = time.monotonic()
        own = await trio.to_thread.run_sync(self.trainer.train, round_)
        t_train = time.monotonic() - began
        began = time.monotonic()
        await self.topics.publish_header(self.node, own.envelope)
        await self.client.ready(round_, header=str(own.header_cid))
        return own, t_train, time.monotonic() - began + own.seconds_store

    async def _catch_up(self, round_: int) -> int:
        try:
            return await self.catch_up.state_for(self.client, self.node, round_)
        except CatchUpError as exc:
            if self.gave_up is None:
                raise
            raise CatchUpError(
                f"{self.gave_up}; and catching up from the swarm failed: {exc}"
            ) from exc

    async def _wait_members(self, round_: int) -> RoundInfo:
        with trio.move_on_after(limits.MEMBERS_WAIT_S):
            return await self.client.wait_members(round_)
        waiting = (await self.client.run_state()).waiting
        raise RoundStalledError(
            f"round {round_}: no member list after {limits.MEMBERS_WAIT_S:g} s "
            f"(coordinator: {waiting or 'no reason given'})"
        )

    async def _play_full(self, info: RoundInfo, own: OwnUpdate) -> RoundOutcome | None:
        """A full-replication round (``exchange.UpdateExchange``); None when this node must
        catch up."""
        try:
            return await self.exchange.play(info, own, self._check_banned)
        except MissingUpdatesError as exc:
            # Aggregating any other set than the agreed one would make this node diverge.
            log.warning("round_given_up", round=info.round, error=str(exc))
            self.reporter.event(Event.ROUND_GIVEN_UP, round=info.round, missing=exc.reasons)
            self.gave_up = exc
            return None

    async def _play_partitioned(self, info: RoundInfo) -> RoundOutcome | None:
        """A partitioned round (``exchange.PartitionedExchange``); None when this node must
        catch up."""
        try:
            outcome = await self.partitioned.play(info)
        except OutputsUnavailableError as exc:
            # An agreed output this node cannot fetch: it must not assemble anything else.
            log.warning("round_given_up", round=info.round, error=str(exc))
            self.reporter.event(
                Event.ROUND_GIVEN_UP, round=info.round, missing={"outputs": str(exc)}
            )
            self.gave_up = MissingUpdatesError(info.round, [], {"outputs": str(exc)})
            return None
        await self._check_banned()
        return outcome

    async def _check_banned(self) -> None:
        """Raise BannedError if this node is banned: learned from gossip or a poll, or, when a
        holder refused it during the round, from the signed state read now."""
        refused = self.exchange.fetcher.refused_by
        if refused:  # holders refused us: banned, and not told yet?
            refused.clear()
            self.take_state(await self.client.run_state(), via="poll")
        self.bans.check_not_banned(self.trainer.peer, self.run_id)

    def take_state(self, state: RunState, *, via: str) -> None:
        """A signed run state arrived (gossip or poll): take its bans."""
        new = self.bans.take(state.bans)
        if new:
            log.info("bans_seen", peers=[p[-8:] for p in new], via=via)
            self.reporter.event(Event.BAN_SEEN, peers=new, via=via)

    async def _agree(self, round_: int, epoch: int, manifest: CID) -> None:
        hub = await self.catch_up.archive(round_, manifest) if self.checkpointer else None
        await agree_on_checkpoint(
            self.client,
            round_=round_,
            epoch=epoch,
            manifest=manifest,
            state_cid=self.trainer.state_cid,
            submit=self.checkpointer,
            hub=hub,
        )

    async def _report_ban(self, ban: BanRecommendation) -> None:
        payload = ban.to_payload()
        try:
            answer = await self.client.report_ban_evidence(payload)
        except CoordinatorRejected as exc:
            log.warning("ban_evidence_refused", accused=ban.peer[-8:], error=str(exc))
            return
        self.reporter.event(
            Event.BAN_REPORTED,
            accused=ban.peer,
            round=ban.round,
            kind=str(ban.kind),
            reason=ban.reason,
            figures=payload.get("figures"),
            reports=answer.reports,
            needed=answer.needed,
            banned=answer.banned,
        )
