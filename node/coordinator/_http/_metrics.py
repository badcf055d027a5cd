"""The coordinator's Prometheus metrics at ``GET /metrics`` (specs/coordinator.md#metrics).

Requests are counted by route and status as they are answered (a middleware); the run's own
figures (round, phase, members, rounds published, bans, allowlist, checkpoints) are read from
the store when ``/metrics`` is scraped, so they are never out of step with the database. The
registry is the server's own, never the process-global one. The page holds no key, token or
address: only counts, like the dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .._store._rows import MemberStatus
from .._store._store import Store
from .._wire._protocol import RoundStatus

__all__ = ["CoordinatorMetrics"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_UNMATCHED = "unmatched"  # the route label of a path no route serves (a bounded label set)


class CoordinatorMetrics:
    """The server's series and the ``/metrics`` route; :meth:`install` adds both to an app."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "cnode_coordinator_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "cnode_coordinator_request_seconds",
            "Seconds to answer a request, by route",
            ["route"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
            registry=self.registry,
        )
        self.registry.register(_RunCollector(store))
        ProcessCollector(registry=self.registry)  # the coordinator's CPU seconds and memory

    def install(self, app: web.Application) -> None:
        # Outermost, so the status counted is the one sent, after json_errors has turned a
        # refusal into its 4xx answer.
        app.middlewares.insert(0, self._count)
        app.add_routes([web.get("/metrics", self._metrics)])

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        route = _route(request)
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.requests.labels(route, str(status)).inc()
            self.seconds.labels(route).observe(time.perf_counter() - started)


def _route(request: web.Request) -> str:
    """The route's pattern (``/v1/runs/{run}/state``), never the raw path: a bounded label."""
    info = request.match_info
    resource = info.route.resource if info.http_exception is None else None
    return resource.canonical if resource is not None else _UNMATCHED


class _RunCollector(Collector):
    """The run's figures, read from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        run = self.store.run_row()
        current = run.round
        yield GaugeMetricFamily("cnode_coordinator_round", "The current round", value=current)
        phase = GaugeMetricFamily(
            "cnode_coordinator_phase", "The run's phase (1 for the current one)", labels=["phase"]
        )
        phase.add_metric([str(run.phase)], 1)
        yield phase
        rounds = GaugeMetricFamily(
            "cnode_coordinator_rounds", "Rounds by status", labels=["status"]
        )
        for round_status in RoundStatus:
            count = len(self.store.rounds_with_status(round_status))
            rounds.add_metric([round_status.value], count)
        yield rounds
        members = GaugeMetricFamily(
            "cnode_coordinator_round_members",
            "Members of the current round, by status",
            labels=["status"],
        )
        for status in MemberStatus:
            members.add_metric([status.value], self.store.count_members(current, status))
        yield members
        bans = GaugeMetricFamily(
            "cnode_coordinator_bans", "Peers banned from the run, by kind", labels=["kind"]
        )
        by_kind: dict[str, int] = {}
        for row in self.store.ban_rows():
            kind = str(row.kind)
            by_kind[kind] = by_kind.get(kind, 0) + 1
        for kind, count in sorted(by_kind.items()):
            bans.add_metric([kind], count)
        yield bans
        yield GaugeMetricFamily(
            "cnode_coordinator_allowlist",
            "Entries on the allowlist",
            value=self.store.allowlist_size(),
        )
        latest = self.store.latest_checkpoint()
        yield GaugeMetricFamily(
            "cnode_coordinator_checkpoint_round",
            "Round of the latest checkpoint (0: none yet)",
            value=0 if latest is None else latest.round,
        )
