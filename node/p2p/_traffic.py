"""Bytes this node exchanged, by peer: what its ``/metrics`` reports (specs/training.md#metrics).

Counted where the bytes are: verified block bytes at the end of each fetch (by holder), and block
bytes the server sent (by requester). Peer ids come from the network, so the tables are bounded:
past :data:`limits.MAX_TRAFFIC_PEERS` distinct peers, the rest are counted under ``other``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import limits
from ._fetch._fetch_types import FetchReport

__all__ = ["OTHER_PEERS", "Traffic"]

OTHER_PEERS = "other"  # the label of peers past MAX_TRAFFIC_PEERS


@dataclass
class Traffic:
    """Running totals by peer id (a holder's gateway URL for HTTP sources)."""

    bytes_in: dict[str, int] = field(default_factory=dict)  # verified bytes fetched from
    bytes_out: dict[str, int] = field(default_factory=dict)  # block bytes served to
    fetch_rate: dict[str, float] = field(default_factory=dict)  # bytes/s, its last fetch
    fetches: int = 0

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
