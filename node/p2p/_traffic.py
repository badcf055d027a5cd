"""Bytes this node exchanged, by peer: what its ``/metrics`` reports (specs/training.md#metrics).

Counted where the bytes are: verified block bytes at the end of each fetch (by holder), and block
bytes the server sent (by requester). Peer ids come from the network, so the tables are bounded:
past :data:`limits.MAX_TRAFFIC_PEERS` distinct peers, the rest are counted under ``other``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from cnode.storage import CID, RAW

from . import limits
from ._fetch._fetch_types import FetchReport

__all__ = ["OTHER_PEERS", "ExchangeStats", "Traffic", "fetch_purpose"]

OTHER_PEERS = "other"  # the label of peers past MAX_TRAFFIC_PEERS

# What the fetches of the current task are for ("segments", "scores", "outputs", ...): the
# requests they make are counted under it (ExchangeStats.by_purpose). Trio tasks inherit it
# from the task that started them, so a Transfer's workers count under their caller's purpose.
_PURPOSE: contextvars.ContextVar[str] = contextvars.ContextVar("fetch_purpose", default="other")


@contextlib.contextmanager
def fetch_purpose(name: str) -> Iterator[None]:
    """Count the block requests made inside this block (by this task and those it starts)
    under ``name`` (specs/blocks.md#instrumentation); nested ones count under the inner name."""
    token = _PURPOSE.set(name)
    try:
        yield
    finally:
        _PURPOSE.reset(token)


def current_purpose() -> str:
    """The purpose requests made now are counted under (``fetch_purpose``)."""
    return _PURPOSE.get()


def request_kind(purpose: str, root: CID | None, cids: Sequence[CID]) -> str:
    """A request's ``purpose/level`` key in ExchangeStats.by_purpose: ``root`` if it names its
    fetch's first CID, ``chunks`` if only raw blocks, ``nodes`` if none, else ``mixed``."""
    if root in cids:
        level = "root"
    else:
        raw = sum(1 for c in cids if c.codec == RAW)
        level = "chunks" if raw == len(cids) else "nodes" if not raw else "mixed"
    return f"{purpose}/{level}"


@dataclass
class ExchangeStats:
    """Where the block exchange spends its time (specs/blocks.md#instrumentation): running sums,
    so a scrape or the node's ``exchange_totals`` log line gives means and totals.

    Requesting side: ``tokens_shown`` ADMIT frames sent (at most one per connection to a holder
    while the token is valid), ``open_s`` seconds from asking for a stream to having it (the
    admission included), ``ttfb_s`` seconds from REQUEST written to the first frame back,
    ``request_s`` / ``request_bytes`` each request's seconds and the bytes it received (their
    ratio is the throughput), ``stalls`` requests given back after NO_PROGRESS_TIMEOUT_S
    without a byte from their holder (re-queued, the holder kept), ``slow_kept`` rate windows a
    holder spent under MIN_SOURCE_RATE and was kept (no other source did better), ``dropped``
    holders dropped for a transfer by kind of evidence. Serving side: ``admissions`` ADMIT
    frames answered (``admissions_by_peer`` by requester), ``served`` requests answered,
    ``serve_wait_s`` seconds from a request's arrival to its first byte sent (its queueing at
    the holder). ``by_purpose``: per ``purpose/level`` (the caller's ``fetch_purpose``; the
    level is ``root`` for a request naming its fetch's first CID, ``nodes`` for manifest
    nodes, ``chunks`` for raw blocks, ``mixed``), requests, blocks asked and bytes received.
    """

    tokens_shown: int = 0
    admit_s: float = 0.0
    requests: int = 0
    open_s: float = 0.0
    ttfb_s: float = 0.0
    ttfb_max_s: float = 0.0
    request_s: float = 0.0
    request_bytes: int = 0
    stalls: int = 0
    slow_kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # kind -> holders dropped
    admissions: int = 0
    admissions_by_peer: dict[str, int] = field(default_factory=dict)
    served: int = 0
    serve_wait_s: float = 0.0
    serve_wait_max_s: float = 0.0
    by_purpose: dict[str, list[int]] = field(default_factory=dict)  # [requests, blocks, bytes]

    def request_done(
        self,
        open_s: float,
        ttfb_s: float | None,
        seconds: float,
        nbytes: int,
        kind: str = "other",
        blocks: int = 0,
    ) -> None:
        """Count one request: ``kind`` is its ``purpose/level`` key, ``blocks`` the CIDs
        it named."""
        counts = self.by_purpose.setdefault(kind, [0, 0, 0])
        counts[0] += 1
        counts[1] += blocks
        counts[2] += nbytes
        self.requests += 1
        self.open_s += open_s
        if ttfb_s is not None:
            self.ttfb_s += ttfb_s
            self.ttfb_max_s = max(self.ttfb_max_s, ttfb_s)
        self.request_s += seconds
        self.request_bytes += nbytes

    def holder_dropped(self, kind: str) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + 1

    def admitted(self, peer: str) -> None:
        self.admissions += 1
        key = _key(self.admissions_by_peer, peer)
        self.admissions_by_peer[key] = self.admissions_by_peer.get(key, 0) + 1

    def serve_started(self, wait_s: float) -> None:
        self.served += 1
        self.serve_wait_s += wait_s
        self.serve_wait_max_s = max(self.serve_wait_max_s, wait_s)

    def summary(self) -> dict[str, float | int | dict[str, list[int]]]:
        """The figures a log line or a bench reads: counts, means and maxima."""
        served, requests = max(self.served, 1), max(self.requests, 1)
        return {
            "admits_shown": self.tokens_shown,  # ("token" keys are redacted in logs)
            "admit_mean_s": round(self.admit_s / max(self.tokens_shown, 1), 4),
            "requests": self.requests,
            "open_mean_s": round(self.open_s / requests, 4),
            "ttfb_mean_s": round(self.ttfb_s / requests, 4),
            "ttfb_max_s": round(self.ttfb_max_s, 3),
            "request_mb_per_s": round(self.request_bytes / 1e6 / max(self.request_s, 1e-9), 2),
            "stalls": self.stalls,
            "slow_kept": self.slow_kept,
            "holders_dropped": sum(self.dropped.values()),
            "admissions": self.admissions,
            "admitting_peers": len(self.admissions_by_peer),
            "max_admissions_one_peer": max(self.admissions_by_peer.values(), default=0),
            "served": self.served,
            "serve_wait_mean_s": round(self.serve_wait_s / served, 4),
            "serve_wait_max_s": round(self.serve_wait_max_s, 3),
            "by_purpose": {k: list(v) for k, v in sorted(self.by_purpose.items())},
        }


@dataclass
class Traffic:
    """Running totals by peer id (a holder's gateway URL for HTTP sources)."""

    bytes_in: dict[str, int] = field(default_factory=dict)  # verified bytes fetched from
    bytes_out: dict[str, int] = field(default_factory=dict)  # block bytes served to
    fetch_rate: dict[str, float] = field(default_factory=dict)  # bytes/s, its last fetch
    fetches: int = 0
    exchange: ExchangeStats = field(default_factory=ExchangeStats)  # where the time goes

    def fetched(self, report: FetchReport) -> FetchReport:
        """Count one fetch: each holder's verified bytes and its rate over the fetch."""
        self.fetches += 1
        for holder, nbytes in report.per_holder_bytes.items():
            key = _key(self.bytes_in, holder)
            self.bytes_in[key] = self.bytes_in.get(key, 0) + nbytes
            if nbytes and report.seconds > 0:
                self.fetch_rate[_key(self.fetch_rate, holder)] = nbytes / report.seconds
        return report

    def served(self, peer: str, nbytes: int) -> None:
        key = _key(self.bytes_out, peer)
        self.bytes_out[key] = self.bytes_out.get(key, 0) + nbytes


def _key(table: dict[str, int] | dict[str, float], peer: str) -> str:
    if peer in table or len(table) < limits.MAX_TRAFFIC_PEERS:
        return peer
    return OTHER_PEERS
