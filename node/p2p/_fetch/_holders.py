"""What the scheduler (``_scheduler.Transfer``) keeps about each holder and each request in
flight: a holder's lacks, bytes and rate (what its batch size and the end game's stealing go by),
and a request's CIDs with what became of each (delivered, moved, skipped, on the wire)."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from cnode.storage import CID
from cnode.storage import limits as storage_limits

from .. import limits
from ._source_rate import RateWindow

__all__ = ["Abandoned", "HolderState", "InFlight"]


@dataclass
class HolderState:
    peer: str
    lacks: set[CID] = field(default_factory=set)
    in_flight: int = 0
    bytes: int = 0
    dropped: str | None = None
    refused: bool = False  # it refused this node outright (FORBIDDEN, or not admitted)
    first_request: float | None = None  # trio time its first request started
    window: RateWindow = field(default_factory=RateWindow)  # bytes on the wire, for the rate

    def observed_s(self) -> float:
        """Seconds since its first request (0 before any)."""
        if self.first_request is None:
            return 0.0
        return trio.current_time() - self.first_request

    def batch_blocks(self) -> int:
        """CIDs to ask this holder for at once: BATCH_BLOCKS, or what it delivers in
        REQUEST_TARGET_S at the rate it has shown (up to MAX_REQUEST_CIDS), so that the round
        trips a request costs (its stream, then its first byte) stay small beside its transfer.
        """
        measured = int(self.rate() * limits.REQUEST_TARGET_S / storage_limits.MAX_BLOCK_SIZE)
        return min(limits.MAX_REQUEST_CIDS, max(limits.BATCH_BLOCKS, measured))

    def rate(self) -> float:
        """Bytes per second delivered since its first request (0 before any)."""
        return self.bytes / max(self.observed_s(), 1e-3)


@dataclass(eq=False)
class InFlight:
    """One request in flight: its CIDs in order and what became of each.

    ``position`` is the request index of the latest BLOCK whose header arrived: that block is
    on the wire until delivered, the CIDs before it that were not delivered were ``skipped``
    (lacked), and only the CIDs after it are unsent.
    """

    holder: HolderState
    cids: list[CID]
    delivered: set[CID] = field(default_factory=set)
    stolen: set[CID] = field(default_factory=set)  # moved to another holder
    skipped: set[CID] = field(default_factory=set)  # passed over by the holder: it lacks them
    position: int = -1
    arrived: set[CID] = field(default_factory=set)  # received whole: being checked or stored
    scope: trio.CancelScope | None = None
    abandoned: bool = False

    def on_wire(self) -> CID | None:
        """The CID whose BLOCK is arriving (header seen, not yet delivered), if any."""
        if self.position < 0:
            return None
        cid = self.cids[self.position]
        return None if cid in self.delivered or cid in self.arrived else cid

    def unsent(self) -> list[CID]:
        """CIDs after the one on the wire that are still this request's, in request order."""
        return [c for c in self.cids[self.position + 1 :] if c not in self.stolen]

    def only_stolen_left(self) -> bool:
        done = self.delivered | self.stolen | self.skipped
        return all(c in done for c in self.cids)


class Abandoned(Exception):
    """Internal: every CID this request still waits for was moved to a faster holder."""
