"""The coordinator's HTTP API (aiohttp, asyncio). See specs/coordinator.md#interaction.

Each handler is short: bound and decode the body, open the signed request, check who may do it,
then apply it in one SQLite transaction (replay counter included) and answer after the commit.
aiohttp and auth errors are translated to JSON ``{"error", "message"}`` answers here and only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog
from aiohttp import web

from cnode.auth import (
    Identity,
    seal,
)

from .. import limits
from .._bans._evidence import EvidenceChecker
from .._bans._reputation import ReputationChecker
from .._bans._verdicts import ReputationVerdict
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import RequestRefused, RunConfigError
from .._store._store import Store
from .._wire._protocol import (
    STATE_TYPE,
    Op,
    RoundStatus,
    Until,
    b64encode,
)
from ._admission import Admission
from ._dashboard import Dashboard
from ._driver import RunDriver
from ._evidence import EvidenceDesk
from ._http import PROTOCOL_LOG, RateLimitedRefusal, json_errors, read_signed_request
from ._metrics import CoordinatorMetrics
from ._ratelimit import RateLimiter
from ._reports import parse_report
from ._requests import (
    int_text,
    parse_admin,
    parse_checkpoint,
    parse_evidence,
    parse_header,
    parse_missing,
    parse_result,
    parse_round,
    parse_score,
    parse_wrong,
)
from ._slots import EvidenceSlots, EvidenceTiming
from ._waits import RoundWaits

__all__ = ["CoordinatorServer", "ServeSettings"]

log = structlog.get_logger(__name__)


def _path_round(request: web.Request) -> int:
    """The round of a ``.../rounds/{round}`` path: an integer in [1, MAX_ROUND]."""
    return int_text(request.match_info["round"], "round", 1, limits.MAX_ROUND, "MAX_ROUND")


class StateSink(Protocol):
    """Where changed states go besides HTTP (``StateGossip``: the run's gossipsub topic)."""

    addrs: list[str]  # put into the run state as p2p_addrs

    def changed(self, signed_state: Callable[[], bytes]) -> None: ...


@dataclass(frozen=True)
class ServeSettings:
    """What one coordinator process serves."""

    config: RunConfig  # the run config file's content
    db: Path  # the SQLite file (created on first start; WAL files beside it)
    identity: Identity  # the coordinator key: signs state and tokens; its peer id is pinned
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port (see CoordinatorServer.url)
    hf_endpoint: str | None = None  # HF Hub for whoami; None = $HF_ENDPOINT or the public Hub
    # Recomputes a partition from evidence (`cnode coordinator serve` gives the training
    # package's); None = evidence is refused 409 no_evidence_checker.
    evidence_checker: EvidenceChecker | None = None
    # Replays the score records to check a reputation-ban report itself (the training
    # package's); None = reputation reports are counted towards a majority like any other.
    reputation_checker: ReputationChecker | None = None
    # Waits and rates of evidence checks: the named limits (tests shorten them).
    evidence_timing: EvidenceTiming = field(default_factory=EvidenceTiming)


class CoordinatorServer:
    """One run's coordinator: ``await start()``, then ``url``; ``await stop()`` at the end.

    Resource handling: ``stop()`` cancels the deadline tick, closes the listener and the database.
    Error handling: a key other than the pinned one, or a DB of another run, raises
    :class:`RunConfigError` from the constructor; request errors never escape (they become 4xx
    answers).
    """

    def __init__(self, settings: ServeSettings, *, gossip: StateSink | None = None) -> None:
        self.settings = settings
        self.identity = settings.identity
        self.peer_id = settings.identity.peer_id_str
        if settings.config.coordinator and settings.config.coordinator != self.peer_id:
            raise RunConfigError(
                f"run config pins coordinator {settings.config.coordinator}, "
                f"but the key is {self.peer_id}"
            )
        self.store = Store(settings.db)
        config = self.store.initialize(settings.config, self.peer_id, time.time())
        self.config = config
        self.run = config.run
        # the rules over the store: every state-changing request goes through it
        self.driver = RunDriver(self.store, config, self.peer_id)
        # join, and the access token every later request carries
        self.admission = Admission(
            self.store, self.driver, config, self.identity, settings.hf_endpoint
        )
        self.admins = {self.peer_id, *config.access.admins}
        self._gossip = gossip
        self._join_limit = RateLimiter(
            limits.JOIN_BURST, limits.JOIN_RATE_PER_S, limits.MAX_RATE_BUCKETS
        )
        self._request_limit = RateLimiter(
            limits.REQUEST_BURST, limits.REQUEST_RATE_PER_S, limits.MAX_RATE_BUCKETS
        )
        # long polls of round records
        self.waits = RoundWaits(self.store, self.driver.scores_closed)
        self.evidence = EvidenceDesk(
            config,
            self.store,
            self.driver,
            self.admission,
            EvidenceSlots(
                limits.MAX_EVIDENCE_CHECKS,
                limits.MAX_EVIDENCE_CHECKS_PER_PEER,
                settings.evidence_timing,
            ),
            self._request_limit,
            self._after_change,
            settings.evidence_checker,
            settings.reputation_checker,
        )
        self._state_cache: tuple[tuple[int, str | None], bytes] | None = None
        self._round_cache: dict[int, str] = {}  # JSON answers of published rounds (immutable)
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.app = web.Application(
            client_max_size=limits.MAX_REQUEST_BYTES, middlewares=[json_errors]
        )
        self.app.cleanup_ctx.append(self._ticker)
        base = "/v1/runs/{run}"
        self.app.add_routes(
            [
                web.get("/v1/health", self._health),
                web.get(f"{base}/state", self._state),
                web.get(f"{base}/rounds/{{round}}", self._round),
                web.get(f"{base}/rounds/{{round}}/scores", self._scores),
                web.get(f"{base}/checkpoints", self._checkpoints),
                *(web.post(f"{base}/{op}", self._post) for op in Op if op is not Op.WRONG_RESULT),
                web.post(
                    f"{base}/rounds/{{round}}/partitions/{{partition}}/evidence", self._evidence
                ),
            ]
        )
        self.dashboard = Dashboard(self.store, self.driver, self.run, self.peer_id)
        self.dashboard.install(self.app)  # GET / and the JSON it polls (read-only)
        self.metrics = CoordinatorMetrics(self.store)
        self.metrics.install(self.app)  # GET /metrics, and every answer counted

    async def start(self) -> str:
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            max_field_size=limits.MAX_HEADER_FIELD_BYTES,
            logger=PROTOCOL_LOG,  # parser refusals in one line, not a traceback
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        host, port = server.sockets[0].getsockname()[:2]  # type: ignore[attr-defined]
        self.url = f"http://{host}:{port}"
        log.info("coordinator_listening", url=self.url, run=self.run, peer=self.peer_id)
        log.info("dashboard", url=f"{self.url}/")
        if self._gossip is not None:
            self._gossip.changed(self._signed_state)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.store.close()

    # -- background deadline tick ---------------------------------------------------------------

    async def _ticker(self, _app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(self._tick_loop())  # owned: cancelled on cleanup below
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(limits.TICK_S)
            now = time.time()
            if self.waits.timed():  # score records close with time alone (the pace rule)
                self.waits.wake()
            due = self.driver.next_due()
            if due is not None and now >= due:
                before = self.store.version()
                with self.store.tx():
                    self.driver.advance(now)
                if self.store.version() != before:
                    await self._after_change()

    async def _after_change(self) -> None:
        self.waits.wake()
        if self._gossip is not None:
            self._gossip.changed(self._signed_state)

    # -- reads ----------------------------------------------------------------------------------

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "run": self.run, "coordinator": self.peer_id})

    def _check_run(self, request: web.Request) -> None:
        run = request.match_info["run"]
        if run != self.run:
            raise RequestRefused(
                E.UNKNOWN_RUN, f"this coordinator serves run {self.run!r}, not {run[:80]!r}"
            )

    def _signed_state(self) -> bytes:
        key = (self.store.version(), self.store.run_row().waiting)
        if self._state_cache is None or self._state_cache[0] != key:
            state = self.driver.run_state(time.time())
            if self._gossip is not None:
                state = dataclasses.replace(state, p2p_addrs=list(self._gossip.addrs))
            self._state_cache = (key, seal(self.identity, STATE_TYPE, state.to_payload()))
        return self._state_cache[1]

    async def _state(self, request: web.Request) -> web.Response:
        self._check_run(request)
        return web.json_response({"envelope": b64encode(self._signed_state())})

    async def _scores(self, request: web.Request) -> web.Response:
        """GET a round's score records (unsigned: each is a signed envelope, and the signed
        round record names its CID)."""
        self._check_run(request)
        n = _path_round(request)
        records = {p: b64encode(b) for p, b in self.store.score_bytes(n).items()}
        return web.json_response({"ok": True, "round": n, "records": records})

    async def _round(self, request: web.Request) -> web.Response:
        self._check_run(request)
        n = _path_round(request)
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError as exc:
            raise RequestRefused(E.BAD_REQUEST, "wait must be a number") from exc
        until_text = request.query.get("until", Until.PUBLISHED)
        if not 0 <= wait <= limits.MAX_LONG_POLL_S or until_text not in set(Until):
            raise RequestRefused(
                E.BAD_REQUEST,
                f"round must be >= 1, wait in [0, {limits.MAX_LONG_POLL_S}] and until one of "
                f"{', '.join(Until)}",
            )
        until = Until(until_text)
        # An agreed round's record is final, but its checkpoint may still be to come.
        if wait > 0 and (n not in self._round_cache or until is Until.CHECKPOINT):
            await self.waits.wait(n, until, wait)
        cached = self._round_cache.get(n)
        if cached is None:
            info = self.driver.round_info(n, time.time())
            envelope = seal(self.identity, STATE_TYPE, info.to_payload())
            cached = json.dumps({"envelope": b64encode(envelope)})
            if info.status is RoundStatus.AGREED:  # final: nothing in it changes any more
                self._round_cache[n] = cached
                while len(self._round_cache) > limits.ROUND_CACHE:
                    del self._round_cache[min(self._round_cache)]
        return web.Response(text=cached, content_type="application/json")

    async def _checkpoints(self, request: web.Request) -> web.Response:
        self._check_run(request)
        query = request.query
        after = int_text(query.get("after", "-1"), "after", -1, limits.MAX_ROUND, "MAX_ROUND")
        limit = int_text(
            query.get("limit", str(limits.MAX_CHECKPOINT_PAGE)),
            "limit",
            1,
            limits.MAX_CHECKPOINT_PAGE,
            "MAX_CHECKPOINT_PAGE",
        )
        history = self.driver.checkpoint_history(after, limit)
        envelope = seal(self.identity, STATE_TYPE, history.to_payload())
        return web.json_response({"envelope": b64encode(envelope)})

    # -- signed requests ------------------------------------------------------------------------

    async def _post(self, request: web.Request) -> web.Response:
        self._check_run(request)
        req = await read_signed_request(request, self.run)
        op, signer, counter, args = req.op, req.signer, req.counter, req.args
        limiter = self._join_limit if op is Op.JOIN else self._request_limit
        wait = 0.0 if signer in self.admins else limiter.take(signer, time.time())
        if wait > 0:  # admins are not rate limited: they hold the run's keys anyway
            raise RateLimitedRefusal(wait)
        before = self.store.version()
        if op is Op.JOIN:
            result = await self.admission.join(signer, counter, args)
        elif op is Op.ADMIN:
            result = self._admin(signer, counter, args)
        elif op is Op.BAN_EVIDENCE:
            evidence = parse_evidence(args)
            verdict = await self.evidence.reputation_verdict(signer, req.token, evidence)
            result = self._peer_op(op, signer, counter, args, req.token, verdict)
        else:
            result = self._peer_op(op, signer, counter, args, req.token)
        if self.store.version() != before:
            await self._after_change()
        return web.json_response({"ok": True, **result})

    async def _evidence(self, request: web.Request) -> web.Response:
        self._check_run(request)
        return await self.evidence.handle(request)

    def access(self, peer: str, token: Any, now: float) -> str:
        """Check ``token`` is this run's access token of ``peer``; return its HF username."""
        return self.admission.access(peer, token, now)

    def _peer_op(
        self,
        op: Op,
        peer: str,
        counter: int,
        args: dict[str, Any],
        token: Any,
        verdict: ReputationVerdict | None = None,
    ) -> dict[str, Any]:
        now = time.time()
        username = self.access(peer, token, now)
        m, reports = self.driver, self.dashboard.reports
        with self.store.tx():
            m.check_not_banned(peer, username)  # revocation: a ban beats any token, at once
            m.consume_counter(peer, counter)
            if op is Op.JOIN_ROUND:
                return {"round": m.join_round(peer, username, now)}
            if op is Op.READY:
                m.ready(peer, parse_round(args), now, parse_header(args))
                return {}
            if op is Op.LEAVE:
                m.leave(peer, parse_round(args), now)
                return {}
            if op is Op.COLLECTED:
                m.collected(peer, parse_round(args), parse_missing(args), now)
                return {}
            if op is Op.RESULT:
                n, partition, header = parse_result(args)
                m.result(peer, n, partition, header, now)
                return {}
            if op is Op.SCORE:
                n, score_record = parse_score(args, peer)
                return {"record": m.score(peer, n, score_record, now)}
            if op is Op.CHECKED:
                m.checked(peer, parse_round(args), parse_wrong(args), now)
                return {}
            if op is Op.REPORT:
                return reports.record(peer, parse_report(args), now)
            if op is Op.CHECKPOINT:
                record = parse_checkpoint(args, peer)
                return {"checkpoint": m.submit_checkpoint(peer, record, now).to_payload()}
            return m.ban_report(peer, parse_evidence(args), now, verdict).to_json()

    def _admin(self, signer: str, counter: int, args: dict[str, Any]) -> dict[str, Any]:
        if signer not in self.admins:
            raise RequestRefused(E.NOT_ADMIN, f"peer {signer} is not an admin of this run")
        action = parse_admin(args)
        with self.store.tx():
            self.driver.consume_counter(signer, counter)
            return self.driver.admin(action, signer, time.time())
