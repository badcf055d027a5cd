"""The network loop of ``cnode train``: join, catch up, and train round after round.

One trio task tree per node process: the libp2p node (block exchange + gossipsub), a task that
collects the signed update headers published on the run's topic, and the round loop. Torch work
runs in a worker thread (``trio.to_thread.run_sync``) so the host keeps serving blocks meanwhile.
The coordinator is reached over HTTP (httpx, under trio). See specs/training.md#interaction.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import structlog
import trio

from cnode.aggregation import BanRecommendation
from cnode.auth import Identity, load_identity
from cnode.node._config import IDENTITY_FILE
from cnode.node._logging import bind_context
from cnode.node.coordinator import (
    BadRunState,
    CoordinatorClient,
    CoordinatorRejected,
    RoundInfo,
    RunConfig,
    RunState,
    load_run_config,
    run_state_topic,
    run_state_validator,
)
from cnode.node.hub import HubLogin, load_hub_login
from cnode.node.p2p import (
    FetchError,
    P2PError,
    P2PNode,
    P2PSettings,
    PeerAdmission,
    open_p2p_node,
)
from cnode.storage import CID, BlockStore

from . import limits
from ._bans import KnownBans
from ._catch_up import CatchUp
from ._config import TrainingConfig
from ._exceptions import RoundStalledError, StateMismatchError, TrainingConfigError
from ._gateway import maybe_gateway
from ._headers import HeaderCollector
from ._report import Reporter
from ._round import UpdateHeader, header_cid
from ._trainer import NodeTrainer

__all__ = ["TrainSettings", "run_node"]

log = structlog.get_logger(__name__)


def updates_topic(run: str) -> str:
    """The gossipsub topic that carries a run's signed update headers."""
    return f"cnode/{run}/updates/1"


@dataclass(frozen=True)
class TrainSettings:
    """What ``cnode train`` was asked to do."""

    run: str
    home: Path
    run_config: Path
    coordinator_url: str  # "" = the run config's url, else default_coordinator_url
    listen: str
    bootstrap: tuple[str, ...]
    blocks_dir: Path
    stop_after_round: int = 0  # 0 = train forever
    checkpointer: bool = False
    attack: str | None = None  # testing aid only
    report: Path | None = None
    upload_rate_bytes_per_s: int = 0
    join_after_round: int = 0  # stay out of the run until this round is published (late join)
    default_coordinator_url: str = ""
    hf_repo: str | None = None  # a checkpointer also uploads each checkpoint to this Hub repo
    # --gateway HOST:PORT: also serve every held block over HTTP (specs/gateway.md), open to all
    gateway: tuple[str, int] | None = None
    # --fetch-gateway URL: trustless gateways tried for a checkpoint after peers, before the Hub
    fetch_gateways: tuple[str, ...] = ()


async def run_node(settings: TrainSettings) -> int:
    """Run one node until ``stop_after_round`` (or forever); return the exit status."""
    identity = load_identity(settings.home / IDENTITY_FILE)
    run_config = load_run_config(settings.run_config)
    if run_config.run != settings.run:
        raise TrainingConfigError(
            f"--run {settings.run!r} but the run config is for run {run_config.run!r}"
        )
    training = TrainingConfig.from_dict(dict(run_config.training))
    login = load_hub_login(settings.home)
    if settings.hf_repo and login is None:
        raise TrainingConfigError(
            f"--hf-repo {settings.hf_repo} needs a Hub login: run cnode init --hf-login first"
        )
    bind_context(peer=identity.peer_id_str, run=settings.run)
    store = BlockStore(settings.blocks_dir)
    reporter = Reporter(settings.report, peer=identity.peer_id_str)
    reporter.event("started", attack=settings.attack, checkpointer=settings.checkpointer)
    trainer = await trio.to_thread.run_sync(
        partial(
            NodeTrainer,
            training,
            run=settings.run,
            identity=identity,
            store=store,
            attack=settings.attack,
        )
    )
    every = run_config.rounds.checkpoint_every or training.checkpoint_every
    session = _Session(settings, trainer, reporter, every, login)
    finished = False
    try:
        try:
            async with CoordinatorClient.for_run(
                run_config,
                identity,
                url=settings.coordinator_url or run_config.url or settings.default_coordinator_url,
            ) as client:
                if settings.join_after_round:
                    await _wait_for_round(client, settings.join_after_round)
                    reporter.event("joining", after_round=settings.join_after_round)
                await session.run(client, run_config, identity, store)
        except BaseExceptionGroup as group:
            # Nurseries wrap errors in groups; a single one is re-raised as itself so the CLI
            # prints its one-line message.
            leaf = _only_leaf(group, done=session.done)
            if leaf is not None:
                raise leaf from None
            if not session.done:
                raise
            log.warning("p2p_teardown_error_ignored", error=str(group))
        finished = True
    finally:
        # Recorded for people and for the demo's report; the exception itself propagates.
        error = sys.exc_info()[1]
        why = f"{type(error).__name__}: {error}" if not finished else "done"
        if finished and session.left:
            why = "left"
        reporter.event("stopped", reason=why)
    return 0


async def _wait_for_round(client: CoordinatorClient, round_: int) -> None:
    """Wait, reading the signed run state, until ``round_`` is published (bounded)."""
    with trio.fail_after(limits.JOIN_WAIT_S):
        while True:
            last = (await client.run_state()).last_round
            if last is not None and last.round >= round_:
                return
            await trio.sleep(limits.POLL_INTERVAL_S * 5)


def _is_libp2p_teardown_race(exc: BaseException) -> bool:
    # py-libp2p 0.8.1: a gossip message that arrives while the host shuts down makes its pubsub
    # schedule a task into a closed nursery. The rounds are done by then; only the exit is noisy.
    return isinstance(exc, RuntimeError) and "closed to new arrivals" in str(exc)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _only_leaf(group: BaseExceptionGroup, *, done: bool) -> Exception | None:
    """The one error that matters inside (nested) groups, else None.

    The libp2p teardown race is noise when it comes with another error, or after the work is
    done; then it is left out.
    """
    leaves = _leaves(group)
    real = [e for e in leaves if not _is_libp2p_teardown_race(e)]
    if not real and done:
        return None
    if len(real) == 1 and isinstance(real[0], Exception):
        return real[0]
    return None


class _Session:
    """The round loop of one node (see the module docstring)."""

    def __init__(
        self,
        settings: TrainSettings,
        trainer: NodeTrainer,
        reporter: Reporter,
        every: int,
        login: HubLogin | None,
    ) -> None:
        self.settings = settings
        self.login = login  # the Hub login of `cnode init --hf-login`, if any
        self.trainer = trainer
        self.reporter = reporter
        self.every = every
        self.run_id = settings.run
        self.bans = KnownBans()
        self.headers = HeaderCollector(settings.run, self.allow)
        self.catch_up = CatchUp(
            run=settings.run,
            trainer=trainer,
            reporter=reporter,
            bans=self.bans,
            every=every,
            workdir=settings.home / "tmp",
            login=login,
            hf_repo=settings.hf_repo,
            gateways=settings.fetch_gateways,
        )
        self.done = False  # every asked-for round is finished (set before the host shuts down)
        self.left = False  # SIGTERM/SIGINT: leave the current round and stop
        self.current_round: int | None = None  # joined and not yet aggregated
        self.own_header: tuple[bytes, float] | None = None  # envelope, republish until (monotonic)

    async def _leave_on_signal(self, rounds: trio.CancelScope) -> None:
        """On SIGTERM or SIGINT, stop the rounds; the node then leaves its current round."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("leaving", signal=signal.Signals(signum).name, round=self.current_round)
                self.left = True
                rounds.cancel()
                return

    async def _leave(self, client: CoordinatorClient) -> None:
        """Tell the coordinator this node leaves its current round (before its list closes,
        the round goes on without it; after, the coordinator drops it at the deadline)."""
        round_ = self.current_round
        if round_ is not None:
            with trio.move_on_after(5):
                try:
                    await client.leave(round_)
                except CoordinatorRejected as exc:
                    log.info("leave_refused", round=round_, error=str(exc))
        self.reporter.event("left", round=round_)

    def allow(self, peer: str) -> bool:
        return peer not in self.bans

    async def run(
        self,
        client: CoordinatorClient,
        run_config: RunConfig,
        identity: Identity,
        store: BlockStore,
    ) -> None:
        if self.login is not None:
            # The coordinator checks the binding and the token with the Hub (HF-account
            # allowlists); without a login the node joins by its peer id alone.
            await client.join(hf_binding=self.login.binding, hf_token=self.login.token)
        else:
            await client.join()
        # Gateways to catch up from: --fetch-gateway first, then the run config's.
        self.catch_up.gateways = tuple(
            dict.fromkeys([*self.settings.fetch_gateways, *run_config.gateways])
        )
        p2p = P2PSettings(
            listen=(self.settings.listen,),
            bootstrap=self.settings.bootstrap,
            upload_rate_bytes_per_s=self.settings.upload_rate_bytes_per_s,
            run_id=self.run_id,
        )
        # Blocks go only to peers that show an access token of this run's coordinator, and
        # this node shows its own to every holder it fetches from (specs/blocks.md#admission).
        admission = PeerAdmission(
            coordinator=run_config.coordinator,
            run=self.run_id,
            credential=lambda: client.token,
            refused=lambda peer: peer in self.bans,
        )
        async with open_p2p_node(
            identity, store, p2p, allow=self.allow, admission=admission
        ) as node:
            self.reporter.event("listening", addrs=node.listen_addrs)
            gateway = maybe_gateway(self.settings.gateway, store, node, self.reporter)
            async with gateway, trio.open_nursery() as nursery:
                nursery.start_soon(self._drain_headers, node)
                nursery.start_soon(self._republish_headers, node)
                nursery.start_soon(self._follow_run_state, client, node, run_config.coordinator)
                with trio.CancelScope() as rounds:
                    nursery.start_soon(self._leave_on_signal, rounds)
                    await self._resume_from_store()
                    while not self.done:
                        self.done = await self._one_round(client, node)
                nursery.cancel_scope.cancel()
            if self.left:
                await self._leave(client)

    async def _republish_headers(self, node: P2PNode) -> None:
        """Publish the latest own header again every HEADER_REPUBLISH_S for a while.

        Gossipsub delivers only to peers already in the topic's mesh; a member that (re)joined
        moments before would miss the single publish. Repeats are cheap (one small message)
        and receivers keep the first copy.
        """
        while True:
            await trio.sleep(limits.HEADER_REPUBLISH_S)
            if self.own_header is not None and time.monotonic() < self.own_header[1]:
                try:
                    await node.publish(updates_topic(self.run_id), self.own_header[0])
                except P2PError as exc:
                    log.info("header_republish_failed", error=str(exc))

    async def _follow_run_state(
        self, client: CoordinatorClient, node: P2PNode, coordinator: str
    ) -> None:
        """Take bans from the coordinator's signed state on gossip as soon as it publishes them.

        Without this a node learns of bans when it reads the state at the end of its round;
        over gossip a ban stops a banned peer's block requests and headers at once. The state
        counts only when signed by the pinned coordinator (the topic validator checks it).
        """
        addrs = (await client.run_state()).p2p_addrs
        for address in addrs:  # the coordinator's gossip node, when it runs one
            try:
                with trio.fail_after(10):
                    await node.connect(address)
            except (P2PError, trio.TooSlowError) as exc:
                log.info("coordinator_gossip_unreachable", address=address, error=str(exc))
        validator = run_state_validator(self.run_id, coordinator)
        async with node.subscribe(run_state_topic(self.run_id), validator) as states:
            async for opened in states:
                try:
                    bans = RunState.from_payload(opened.payload).bans
                except BadRunState as exc:  # signed, yet malformed: ignore it, polling goes on
                    log.warning("bad_run_state_on_gossip", error=str(exc))
                    continue
                new = self.bans.take(bans)
                if new:
                    log.info("bans_from_gossip", peers=[p[-8:] for p in new])
                    self.reporter.event("ban_seen", peers=new, via="gossip")

    async def _drain_headers(self, node: P2PNode) -> None:
        async with node.subscribe(updates_topic(self.run_id), self.headers) as sub:
            async for _ in sub:
                pass  # the validator already recorded the header

    async def _resume_from_store(self) -> None:
        """A restarted node takes its own latest checkpoint, if it has one."""
        pinned = self.trainer.store.pins().get(self.trainer.pin_name)
        if pinned is not None:
            await trio.to_thread.run_sync(self.trainer.adopt_checkpoint, pinned)
            self.reporter.event("resumed", round=self.trainer.round, manifest=str(pinned))

    async def _one_round(self, client: CoordinatorClient, node: P2PNode) -> bool:
        """Play one round; True when the node is done."""
        trainer = self.trainer
        # Normally joined at the end of the previous round already (see below).
        round_ = self.current_round or await client.join_round()
        self.current_round = round_
        self.headers.forget_before(round_ - 1)  # a joiner's window starts at its first round
        bind_context(round=round_)
        stop = self.settings.stop_after_round
        if stop and round_ > stop:
            await client.leave(round_)  # joined too late for the rounds it was asked to train
            return True
        if round_ != trainer.round + 1:
            round_ = self.current_round = await self.catch_up.state_for(client, node, round_)
            if stop and round_ > stop:
                await client.leave(round_)
                return True
        began = time.monotonic()
        info: RoundInfo | None = None
        own = await trio.to_thread.run_sync(trainer.train, round_)
        t_train = time.monotonic() - began
        began = time.monotonic()
        self.headers.seen[(round_, trainer.peer)] = (own.envelope, own.header)
        await node.announce_update(own.header.update, round_)
        await node.publish(updates_topic(self.run_id), own.envelope)
        self.own_header = (own.envelope, time.monotonic() + limits.HEADER_REPUBLISH_FOR_S)
        await client.ready(round_)
        t_publish = time.monotonic() - began + own.seconds_store
        with trio.move_on_after(limits.MEMBERS_WAIT_S):
            info = await client.wait_members(round_)
        if info is None:
            waiting = (await client.run_state()).waiting
            raise RoundStalledError(
                f"round {round_}: no member list after {limits.MEMBERS_WAIT_S:g} s "
                f"(coordinator: {waiting or 'no reason given'})"
            )
        members = sorted(info.members)[: limits.MAX_ROUND_MEMBERS]
        began = time.monotonic()
        headers, dropped = await self._fetch_updates(node, round_, members)
        if any("FORBIDDEN" in why for why in dropped.values()):
            await self._refresh_bans(client)  # refused by holders: banned, and not told yet?
        # Peers refuse a banned node's fetches: say why, not "no valid update".
        self.bans.check_not_banned(trainer.peer, self.run_id)
        trainer.check_agreement(round_, {peer: header for peer, (_, header) in headers.items()})
        t_fetch = time.monotonic() - began
        began = time.monotonic()
        outcome = await trio.to_thread.run_sync(trainer.aggregate, round_, headers, dropped)
        t_aggregate = time.monotonic() - began
        self.headers.forget_before(round_)  # this round's headers are in the store now
        self.current_round = None
        last = bool(stop) and round_ >= stop
        if not last:
            # Join the next round now: its list closes when its first member is ready, and a
            # node that joins after that waits a whole round (DISCO's rule for late comers).
            self.current_round = await client.join_round()
        manifest = None
        if round_ % self.every == 0:
            manifest = await trio.to_thread.run_sync(trainer.store_checkpoint)
            await node.announce_hold(manifest)
            await self._agree(client, round_, info.epoch, manifest)
        for ban in outcome.bans:
            await self._report_ban(client, ban)
        loss = await trio.to_thread.run_sync(trainer.evaluate)
        self.reporter.event(
            "round",
            round=round_,
            loss=loss,
            state_cid=str(trainer.state_cid),
            manifest=None if manifest is None else str(manifest),
            members=list(outcome.members),
            dropped=outcome.dropped,
            local_loss=[own.local.loss_first, own.local.loss_last],
            train_s=t_train,
            publish_s=t_publish,
            fetch_s=t_fetch,
            aggregate_s=t_aggregate,
        )
        await self._refresh_bans(client)
        return last

    async def _fetch_updates(
        self, node: P2PNode, round_: int, members: list[str]
    ) -> tuple[dict[str, tuple[CID, UpdateHeader]], dict[str, str]]:
        """The signed headers and update blocks of the round's members (bounded in time)."""
        headers: dict[str, tuple[CID, UpdateHeader]] = {}
        dropped: dict[str, str] = {}
        with trio.move_on_after(limits.HEADER_WAIT_S):
            # Headers were published before their senders said ready, so they are normally
            # here already; wait a little for stragglers of the gossip mesh.
            while not all((round_, m) in self.headers.seen for m in members):
                self.headers.arrived = trio.Event()
                with trio.move_on_after(1.0):
                    await self.headers.arrived.wait()
        for member in members:
            seen = self.headers.seen.get((round_, member))
            if seen is None:
                dropped[member] = "no signed update header arrived"
                continue
            envelope, header = seen
            cid = header_cid(envelope)
            if not self.trainer.store.has(cid):
                self.trainer.store.put(cid, envelope)
            headers[member] = (cid, header)

        async def fetch_one(member: str, update: CID) -> None:
            # First from its author; if that fails (unreachable, gone), from every connected
            # member: those that fetched it already hold the same verified blocks.
            failure = "no attempt finished in time"
            with trio.move_on_after(limits.ROUND_FETCH_S):
                for attempt in range(limits.FETCH_ATTEMPTS):
                    holders = [member]
                    if attempt:
                        holders += [p for p in node.connected_peers() if p in others]
                    try:
                        await node.fetch(update, holders=holders)
                        return
                    except (FetchError, P2PError) as exc:
                        failure = str(exc)
                        log.info("update_fetch_retry", member=member[-8:], error=failure)
                    await trio.sleep(limits.FETCH_RETRY_S * (attempt + 1))
            dropped[member] = f"update not fetched: {failure}"

        others = set(members) - {self.trainer.peer}

        async with trio.open_nursery() as nursery:
            for member, (_cid, header) in headers.items():
                if member != self.trainer.peer:
                    nursery.start_soon(fetch_one, member, header.update)
        for member in dropped:
            headers.pop(member, None)
        return headers, dropped

    async def _agree(
        self, client: CoordinatorClient, round_: int, epoch: int, manifest: CID
    ) -> None:
        """Check this node's checkpoint of ``round_`` against the one the coordinator holds.

        Checkpoint manifests are deterministic, so every honest node stores the same bytes: a
        different manifest for the same round means a different state, and that is fatal.
        """
        if self.settings.checkpointer:
            hub = await self.catch_up.archive(round_, manifest)
            try:
                await client.submit_checkpoint(
                    epoch=epoch,
                    round=round_,
                    manifest=str(manifest),
                    hf_repo=None if hub is None else hub.repo,
                    hf_revision=None if hub is None else hub.revision,
                )
            except CoordinatorRejected as exc:
                if exc.code == "stale_round":
                    raise StateMismatchError(
                        f"round {round_}: this node's checkpoint {manifest} (state "
                        f"{self.trainer.state_cid}) differs from the swarm's: {exc}"
                    ) from exc
                raise
            return
        with trio.move_on_after(limits.AGREE_WAIT_S):
            while True:
                record = (await client.run_state()).checkpoint
                if record is not None and record.round >= round_:
                    if record.round == round_ and record.manifest != str(manifest):
                        raise StateMismatchError(
                            f"round {round_}: this node's checkpoint {manifest} (state "
                            f"{self.trainer.state_cid}) differs from the swarm's {record.manifest}"
                        )
                    return
                await trio.sleep(limits.POLL_INTERVAL_S)
        log.warning("checkpoint_not_confirmed", round=round_, manifest=str(manifest))

    async def _report_ban(self, client: CoordinatorClient, ban: BanRecommendation) -> None:
        payload = ban.to_payload()
        try:
            answer = await client.report_ban_evidence(payload)
        except CoordinatorRejected as exc:
            log.warning("ban_evidence_refused", accused=ban.peer[-8:], error=str(exc))
            return
        self.reporter.event(
            "ban_reported",
            accused=ban.peer,
            round=ban.round,
            reason=ban.reason,
            figures=payload.get("figures"),
            reports=answer.reports,
            needed=answer.needed,
            banned=answer.banned,
        )

    async def _refresh_bans(self, client: CoordinatorClient) -> None:
        self.bans.take((await client.run_state()).bans)
