"""``cnode train``: open the node, join the run, and hand over to the round loop.

One trio task tree per node process: the libp2p node (block exchange + gossipsub), the run's
topics (``_topics``), peer discovery through the coordinator (``_peers``), a signal watcher, and
the round loop (``_rounds``). Torch work runs in a worker thread (``trio.to_thread.run_sync``) so
the host keeps serving blocks meanwhile. The coordinator is reached over HTTP (httpx, under
trio). See specs/training.md#interaction.
"""

from __future__ import annotations

import contextlib
import signal
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import structlog
import trio

from cnode.auth import Identity, load_identity
from cnode.node._config import IDENTITY_FILE
from cnode.node._logging import bind_context
from cnode.node.coordinator import CoordinatorClient, RunConfig, load_run_config
from cnode.node.hub import HubLogin, load_hub_login
from cnode.node.p2p import (
    P2PNode,
    P2PSettings,
    PeerAdmission,
    open_p2p_node,
    unwrap_node_errors,
)
from cnode.node.p2p import limits as p2p_limits
from cnode.storage import BlockStore

from . import limits
from ._catch_up import CatchUp
from ._config import TrainingConfig
from ._exceptions import TrainingConfigError
from ._report import Ending, Event, Reporter
from ._round_loop import RoundLoop
from ._stop import NodeStopped, StopReason, stop_reason_of
from ._trainer import NodeTrainer
from .exchange import MemberFetcher, PartitionedExchange, UpdateExchange
from .model import Placement, check_model_fits
from .swarm import (
    HeaderCollector,
    KnownBans,
    NodeMetrics,
    PeerFinder,
    RunTopics,
    advertised_addrs,
    leave_round,
    maybe_gateway,
    say_reachability,
    serve_metrics,
)

__all__ = ["NODE_ATTACKS", "TrainSettings", "run_node"]

# Testing aids (``--attack``) that act on the network or the aggregation rather than on the
# update: "withhold" publishes its header and says ready, then serves its update to nobody (an
# update no member can fetch, which the round's agreed decision must drop on every node) and, as
# a partition's aggregator, never publishes its result (a backup takes the partition over);
# "wrong_partition" signs a wrong partition result (caught, recomputed and banned);
# "extreme_scores" signs score records with issue 29's finite but out-of-range losses (5.0,
# -1e308, 5.0, 4.9: the record is refused and its signer banned on the coordinator's own check);
# "zero_scores" signs in-range records that state every loss 0 (disputed, recomputed, named).
NODE_ATTACKS = ("withhold", "wrong_partition", "extreme_scores", "zero_scores", "busy_holder")

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """What ``cnode train`` was asked to do."""

    run: str
    home: Path
    run_config: Path
    coordinator_url: str  # "" = the run config's url, else default_coordinator_url
    listen: str
    bootstrap: tuple[str, ...]  # extra peers to dial; the coordinator names the run's peers
    blocks_dir: Path
    stop_after_round: int = 0  # 0 = train forever
    checkpointer: bool = False
    attack: str | None = None  # testing aid only
    report: Path | None = None
    upload_rate_bytes_per_s: int = 0
    join_after_round: int = 0  # stay out of the run until this round is published (late join)
    default_coordinator_url: str = ""
    hf_repo: str | None = None  # a checkpointer also uploads each checkpoint to this Hub repo
    announce_addrs: tuple[str, ...] = ()  # --announce-addr: advertise these instead (port maps)
    # --gateway HOST:PORT: also serve every held block over HTTP (specs/gateway.md), open to all
    gateway: tuple[str, int] | None = None
    # --fetch-gateway URL: trustless gateways tried for a checkpoint after peers, before the Hub
    fetch_gateways: tuple[str, ...] = ()
    # --metrics HOST:PORT: serve Prometheus metrics there (specs/training.md#metrics)
    metrics: tuple[str, int] | None = None
    device: str = "auto"  # --device / [node] device (model/_device.py)
    precision: str = ""  # --precision / [node] precision; "" = the run's training.precision


async def run_node(settings: TrainSettings) -> int:
    """Run one node until ``stop_after_round`` (or forever); return the exit status."""
    session = await _open_session(settings)
    return await _run_session(session)


async def _open_session(settings: TrainSettings) -> _Session:
    """Everything a node needs before it talks to the network: its key, the run's config, a
    model that fits this machine, its device, its block store, its report and its trainer."""
    identity = load_identity(settings.home / IDENTITY_FILE)
    run_config = load_run_config(settings.run_config)
    if run_config.run != settings.run:
        raise TrainingConfigError(
            f"--run {settings.run!r} but the run config is for run {run_config.run!r}"
        )
    training = TrainingConfig.for_run(dict(run_config.training))
    check_model_fits(training)  # before the model, the data or the network is touched
    login = load_hub_login(settings.home)
    if settings.hf_repo and login is None:
        raise TrainingConfigError(
            f"--hf-repo {settings.hf_repo} needs a Hub login: run cnode init --hf-login first"
        )
    bind_context(peer=identity.peer_id_str, run=settings.run)
    placement = Placement.resolve(settings.device, settings.precision or training.precision)
    log.info("device_picked", device=str(placement.device), said=placement.said,
             precision=placement.precision)  # fmt: skip
    store = BlockStore(settings.blocks_dir)
    reporter = Reporter(settings.report, peer=identity.peer_id_str)
    reporter.event(
        Event.STARTED,
        attack=settings.attack,
        checkpointer=settings.checkpointer,
        device=str(placement.device),
        precision=placement.precision,
    )
    trainer = await trio.to_thread.run_sync(
        partial(
            NodeTrainer,
            training,
            run=settings.run,
            identity=identity,
            store=store,
            attack=settings.attack,
            placement=placement,
        )
    )
    return _Session(settings, run_config, identity, store, trainer, reporter, login)


async def _run_session(session: _Session) -> int:
    """Run the session against the run's coordinator; every stop gets its reason and status."""
    settings, run_config, identity = session.settings, session.run_config, session.identity
    reporter = session.reporter
    why = Ending.DONE
    try:
        async with CoordinatorClient.for_run(
            run_config,
            identity,
            url=settings.coordinator_url or run_config.url or settings.default_coordinator_url,
        ) as client:
            if settings.join_after_round:
                await _wait_for_round(client, settings.join_after_round)
                reporter.event(Event.JOINING, after_round=settings.join_after_round)
            try:
                await session.run(client)
            except BaseExceptionGroup as group:
                # Nurseries wrap errors in groups; a lone one is re-raised as itself so the CLI
                # prints its one-line message (py-libp2p's teardown races are left out).
                error = unwrap_node_errors(group)
                if error is not None:
                    raise error from None
        if session.left:
            why = Ending.LEFT
    except (Exception, BaseExceptionGroup) as exc:
        # Every stop gets one reason of the closed set (_stop.py), in the report and the CLI's
        # exit status; an unexpected error is "internal" and keeps its traceback in the log.
        reason = stop_reason_of(exc)
        evidence = exc.evidence if isinstance(exc, NodeStopped) else f"{type(exc).__name__}: {exc}"
        if reason is StopReason.INTERNAL:
            log.exception("stopped_on_internal_error")
        reporter.event(
            Event.STOPPED, reason=evidence, stop_reason=reason.value, exit_code=reason.exit_code
        )
        raise NodeStopped(reason, evidence) from exc
    except BaseException as exc:  # cancelled, KeyboardInterrupt: the process is told to end
        reporter.event(
            Event.STOPPED, reason=f"{type(exc).__name__}: {exc}", stop_reason=StopReason.FINISHED
        )
        raise
    reporter.event(Event.STOPPED, reason=why, stop_reason=StopReason.FINISHED, exit_code=0)
    return 0


async def _wait_for_round(client: CoordinatorClient, round_: int) -> None:
    """Wait, reading the signed run state, until ``round_`` is published (bounded)."""
    with trio.fail_after(limits.JOIN_WAIT_S):
        while True:
            last = (await client.run_state()).last_round
            if last is not None and last.round >= round_:
                return
            await trio.sleep(limits.SLOW_POLL_S)


class _Session:
    """One node in one run: its p2p node, its tasks, and the round loop."""

    def __init__(
        self,
        settings: TrainSettings,
        run_config: RunConfig,
        identity: Identity,
        store: BlockStore,
        trainer: NodeTrainer,
        reporter: Reporter,
        login: HubLogin | None,
    ) -> None:
        self.settings = settings
        self.run_config = run_config
        self.identity = identity
        self.store = store
        self.trainer = trainer
        self.reporter = reporter
        self.login = login  # the Hub login of `cnode init --hf-login`, if any
        self.every = run_config.rounds.checkpoint_every or trainer.config.checkpoint_every
        self.bans = KnownBans()
        self.headers = HeaderCollector(settings.run, lambda peer: peer not in self.bans)
        self.left = False  # SIGTERM/SIGINT: left the current round and stopped
        self.listening: dict[str, object] = {}  # the LISTENING event's fields (reachability)

    async def run(self, client: CoordinatorClient) -> None:
        settings, run = self.settings, self.settings.run
        p2p = P2PSettings(
            listen=(settings.listen,),
            bootstrap=settings.bootstrap,
            upload_rate_bytes_per_s=settings.upload_rate_bytes_per_s,
            run_id=run,
            # Testing aid (issue 41): alive, but sending nothing for a while, as when busy.
            busy_for_tests=p2p_limits.BUSY_HOLDER_TEST_S * (settings.attack == "busy_holder"),
        )
        # Blocks go only to peers that show an access token of this run's coordinator, and
        # this node shows its own to every holder it fetches from (specs/blocks.md#admission).
        admission = PeerAdmission(
            coordinator=self.run_config.coordinator,
            run=run,
            credential=lambda: client.token,
            refused=lambda peer: peer in self.bans,
        )
        allow = lambda peer: peer not in self.bans  # noqa: E731
        if settings.attack == "withhold":
            allow = lambda _peer: False  # noqa: E731 - testing aid: serve nobody
        async with open_p2p_node(
            self.identity, self.store, p2p, allow=allow, admission=admission
        ) as node:
            await self._join(client, node)
            finder = PeerFinder(node, refused=lambda peer: peer in self.bans)
            fetcher = MemberFetcher(run, node.peer_id, node, self.headers, finder)
            loop = self._round_loop(client, node, finder, fetcher)
            gateway = maybe_gateway(settings.gateway, self.store, node, self.reporter)
            with contextlib.ExitStack() as metrics:
                if settings.metrics is not None:
                    node_metrics = NodeMetrics(node.traffic)
                    node_metrics.observe(Event.LISTENING, self.listening)  # said before it
                    self.reporter.observers.append(node_metrics)
                    url = metrics.enter_context(
                        serve_metrics(settings.metrics, node_metrics.registry)
                    )
                    self.reporter.event(Event.METRICS, url=url)
                await self._play(loop, node, client, finder, gateway)
            if self.left and loop.current_round is not None:
                await leave_round(client, loop.current_round)
            if self.left:
                self.reporter.event(Event.LEFT, round=loop.current_round)

    async def _join(self, client: CoordinatorClient, node: P2PNode) -> None:
        """Join the run, advertising the addresses other members can dial."""
        settings = self.settings
        addrs = advertised_addrs(
            node.listen_addrs,
            settings.announce_addrs,
            peer=node.peer_id,
            allow_private=self.run_config.network.allow_private_addrs,
        )
        if self.login is not None:
            # The coordinator checks the binding and the token with the Hub (HF-account
            # allowlists); without a login the node joins by its peer id alone.
            joined = await client.join(
                hf_binding=self.login.binding, hf_token=self.login.token, addrs=addrs
            )
        else:
            joined = await client.join(addrs=addrs)
        self.listening = {
            "addrs": node.listen_addrs,
            "advertised": addrs,
            "reachable": joined.reachable,
            "reachability": joined.reachability,
        }
        say_reachability(joined.reachability, addrs, joined.reachable)
        self.reporter.event(Event.LISTENING, **self.listening)

    def _round_loop(
        self, client: CoordinatorClient, node: P2PNode, finder: PeerFinder, fetcher: MemberFetcher
    ) -> RoundLoop:
        """The round loop of this node, with its exchanges (full and partitioned) and catch-up."""
        settings, run = self.settings, self.settings.run
        exchange = UpdateExchange(
            self.trainer,
            client,
            fetcher,
            collect_timeout_s=self.run_config.rounds.collect_timeout_s,
            late_max_s=self.run_config.rounds.late_max_s,
        )
        return RoundLoop(
            run_id=run,
            trainer=self.trainer,
            reporter=self.reporter,
            client=client,
            node=node,
            topics=RunTopics(run, self.run_config.coordinator, self.headers),
            exchange=exchange,
            partitioned=PartitionedExchange(
                self.trainer,
                node,
                client,
                fetcher,
                withhold=settings.attack == "withhold",
            ),
            headers=self.headers,
            catch_up=CatchUp(
                run=run,
                trainer=self.trainer,
                reporter=self.reporter,
                bans=self.bans,
                every=self.every,
                workdir=settings.home / "tmp",
                login=self.login,
                hf_repo=settings.hf_repo,
                # Gateways to catch up from: --fetch-gateway first, then the run config's.
                gateways=tuple(
                    dict.fromkeys([*settings.fetch_gateways, *self.run_config.gateways])
                ),
                connect_peers=lambda: finder.dial_state(client),
            ),
            bans=self.bans,
            every=self.every,
            stop_after_round=settings.stop_after_round,
            checkpointer=settings.checkpointer,
        )

    async def _play(
        self,
        loop: RoundLoop,
        node: P2PNode,
        client: CoordinatorClient,
        finder: PeerFinder,
        gateway: AbstractAsyncContextManager[None],
    ) -> None:
        """The round loop with its companions: gossip, peer discovery, the signal watcher."""
        settings = self.settings
        async with gateway, trio.open_nursery() as nursery:
            nursery.start_soon(loop.topics.run_all, node, partial(loop.take_state, via="gossip"))
            nursery.start_soon(
                finder.follow,
                client,
                settings.bootstrap,
                partial(loop.take_state, via="poll"),
            )
            with trio.CancelScope() as rounds:
                nursery.start_soon(self._leave_on_signal, rounds)
                await loop.run()
            nursery.cancel_scope.cancel()

    async def _leave_on_signal(self, rounds: trio.CancelScope) -> None:
        """On SIGTERM or SIGINT, stop the rounds; the node then leaves its current round."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("leaving", signal=signal.Signals(signum).name)
                self.left = True
                rounds.cancel()
                return
