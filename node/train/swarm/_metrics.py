"""The node's Prometheus metrics (``cnode train --metrics HOST:PORT``; specs/training.md#metrics).

Two sources, so the round's code needs no hooks of its own: the node's report events (rounds,
phase seconds, updates left out, bans, catch-ups) update counters as they are written, and the
p2p node's :class:`~cnode.node.p2p.Traffic` (bytes in and out by peer, fetch rates by holder) is
read when ``/metrics`` is scraped. Each node has its own registry, never the process-global one,
so several nodes (and tests) in one process do not share series.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from cnode.node.p2p import Traffic

from .._exceptions import TrainingConfigError
from .._report import Event

__all__ = ["PHASES", "NodeMetrics", "serve_metrics"]

log = structlog.get_logger(__name__)

# The phases a "round" event times, as the report names them (``<phase>_s``).
PHASES = ("train", "publish", "fetch", "aggregate")
_PHASE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600)
# Distinct peers the left-out counter keeps apart; the rest count as "other". Why each update
# was left out is in the report's ``round`` event (``dropped``: peer -> reason), not a label:
# reasons are sentences, and a label must come from a bounded set.
MAX_LEFT_OUT_PEERS = 256


class NodeMetrics:
    """One node's series; :meth:`observe` is given every report event."""

    def __init__(self, traffic: Traffic | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rounds = Counter("cnode_node_rounds", "Rounds this node completed", registry=r)
        self.round = Gauge("cnode_node_round", "The last round this node completed", registry=r)
        self.loss = Gauge(
            "cnode_node_heldout_loss", "Held-out loss after the last round", registry=r
        )
        self.members = Gauge(
            "cnode_node_round_members", "Updates aggregated in the last round", registry=r
        )
        self.phase = Histogram(
            "cnode_node_phase_seconds",
            "Seconds per round phase",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.round_bytes = Counter(
            "cnode_node_round_bytes",
            "Bytes of the rounds' exchanges (in: verified bytes fetched; out: served)",
            ["direction"],
            registry=r,
        )
        self.left_out = Counter(
            "cnode_node_updates_left_out",
            "Members' updates this node's rounds left out, by member (why: the report)",
            ["peer"],
            registry=r,
        )
        self.given_up = Counter(
            "cnode_node_rounds_given_up", "Rounds this node gave up (caught up instead)", registry=r
        )
        self.bans = Gauge("cnode_node_bans_seen", "Peers this node knows are banned", registry=r)
        self.ban_reports = Counter(
            "cnode_node_ban_reports", "Ban reports this node sent the coordinator", registry=r
        )
        self.catch_ups = Counter("cnode_node_catch_ups", "Checkpoints caught up to", registry=r)
        self.catch_up_seconds = Gauge(
            "cnode_node_catch_up_seconds", "Seconds the last catch-up's fetch took", registry=r
        )
        self.reachability = Gauge(
            "cnode_node_reachability",
            "1 for this node's reachability as the coordinator's dial-back found it at join",
            ["reachability"],
            registry=r,
        )
        self._banned: set[str] = set()
        self._left_out_peers: set[str] = set()
        for phase in PHASES:  # every phase is present from the start, at zero
            self.phase.labels(phase)
        for direction in ("in", "out"):
            self.round_bytes.labels(direction)
        if traffic is not None:
            r.register(_TrafficCollector(traffic))
        ProcessCollector(registry=r)  # CPU seconds, resident memory, open fds

    def observe(self, event: Event, fields: dict[str, Any]) -> None:
        """Update the series from one report event (the Reporter calls this for each)."""
        if event is Event.ROUND:
            self.rounds.inc()
            self.round.set(int(fields.get("round", 0)))
            self.loss.set(float(fields.get("loss", float("nan"))))
            self.members.set(len(fields.get("members", ())))
            for phase in PHASES:
                seconds = fields.get(f"{phase}_s")
                if isinstance(seconds, int | float) and seconds >= 0:
                    self.phase.labels(phase).observe(seconds)
            for direction in ("in", "out"):
                nbytes = fields.get(f"bytes_{direction}")
                if isinstance(nbytes, int) and nbytes >= 0:
                    self.round_bytes.labels(direction).inc(nbytes)
            for peer in dict(fields.get("dropped") or {}):
                self._left_out_peers.add(str(peer))
                known = str(peer) in self._left_out_peers
                if len(self._left_out_peers) > MAX_LEFT_OUT_PEERS:
                    self._left_out_peers.discard(str(peer))
                    known = False
                self.left_out.labels(str(peer) if known else "other").inc()
        elif event is Event.LISTENING and fields.get("reachability"):
            for kind in ("public", "outbound-only"):
                self.reachability.labels(kind).set(int(fields["reachability"] == kind))
        elif event is Event.ROUND_GIVEN_UP:
            self.given_up.inc()
        elif event is Event.BAN_SEEN:
            self._banned.update(str(p) for p in fields.get("peers", ()))
            self.bans.set(len(self._banned))
        elif event is Event.BAN_REPORTED:
            self.ban_reports.inc()
        elif event is Event.CAUGHT_UP:
            self.catch_ups.inc()
            seconds = fields.get("fetch_seconds")
            if isinstance(seconds, int | float):
                self.catch_up_seconds.set(seconds)


class _TrafficCollector(Collector):
    """Bytes by peer and fetch rates by holder, read from the p2p node at scrape time."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        t = self.traffic
        bytes_in = CounterMetricFamily(
            "cnode_node_bytes_in", "Verified block bytes fetched, by holder", labels=["peer"]
        )
        for peer, nbytes in sorted(dict(t.bytes_in).items()):
            bytes_in.add_metric([peer], nbytes)
        yield bytes_in
        bytes_out = CounterMetricFamily(
            "cnode_node_bytes_out", "Block bytes served, by requester", labels=["peer"]
        )
        for peer, nbytes in sorted(dict(t.bytes_out).items()):
            bytes_out.add_metric([peer], nbytes)
        yield bytes_out
        rate = GaugeMetricFamily(
            "cnode_node_fetch_rate_bytes_per_second",
            "Each holder's share of its last fetch, over that fetch's seconds",
            labels=["peer"],
        )
        for peer, value in sorted(dict(t.fetch_rate).items()):
            rate.add_metric([peer], value)
        yield rate
        yield CounterMetricFamily("cnode_node_fetches", "Fetches this node made", value=t.fetches)
        yield from _exchange_series(t)


def _exchange_series(t: Traffic) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """Where the block exchange spends its time (specs/blocks.md#instrumentation)."""
    x = t.exchange
    for name, doc, value in (
        ("tokens_shown", "Access tokens this node showed holders (ADMIT sent)", x.tokens_shown),
        ("admit_seconds", "Seconds spent showing access tokens", x.admit_s),
        ("requests", "Block requests this node made", x.requests),
        ("open_seconds", "Seconds from asking for a request's stream to having it", x.open_s),
        ("ttfb_seconds", "Seconds from a request's stream to its first byte back", x.ttfb_s),
        ("request_seconds", "Seconds block requests ran", x.request_s),
        ("request_bytes", "Bytes block requests received on the wire", x.request_bytes),
        ("stalls", "Requests given back after no byte for NO_PROGRESS_TIMEOUT_S", x.stalls),
        ("slow_kept", "Rate windows a holder was under MIN_SOURCE_RATE and kept", x.slow_kept),
        ("admissions", "Access tokens this node's holder admitted", x.admissions),
        ("served", "Block requests this node answered", x.served),
        ("serve_wait_seconds", "Seconds requests waited here for their first byte", x.serve_wait_s),
    ):
        yield CounterMetricFamily(f"cnode_node_exchange_{name}", doc, value=value)
    dropped = CounterMetricFamily(
        "cnode_node_exchange_holders_dropped",
        "Holders dropped for a fetch, by kind",
        labels=["kind"],
    )
    for kind, count in sorted(dict(x.dropped).items()):
        dropped.add_metric([kind], count)
    yield dropped
    by_purpose = CounterMetricFamily(
        "cnode_node_exchange_requests_by_purpose",
        "Block requests this node made, by what they were for and the manifest level asked",
        labels=["purpose", "level"],
    )
    for key, counts in sorted(dict(x.by_purpose).items()):
        purpose, _, level = key.partition("/")
        by_purpose.add_metric([purpose, level], counts[0])
    yield by_purpose


@contextmanager
def serve_metrics(address: tuple[str, int], registry: CollectorRegistry) -> Iterator[str]:
    """Serve ``registry`` at ``http://HOST:PORT/metrics`` while the block runs; yield the URL.

    prometheus_client serves from its own thread (a WSGI server); it is shut down and joined
    when the block ends, whatever ends it. Error handling: TrainingConfigError naming the
    address when it cannot be listened on.
    """
    try:
        server, thread = start_http_server(address[1], addr=address[0], registry=registry)
    except OSError as exc:  # taken, or not an address of this machine: the operator's to fix
        raise TrainingConfigError(
            f"--metrics {address[0]}:{address[1]}: cannot listen there ({exc.strerror or exc})"
        ) from exc
    port = server.server_port  # the bound one, when address asked for port 0
    url = f"http://{address[0]}:{port}/metrics"
    log.info("metrics_listening", url=url)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        if thread.is_alive():  # never expected: serve_forever returns on shutdown()
            log.warning("metrics_thread_alive")
