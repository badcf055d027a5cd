"""What the scheduler (``_scheduler.Transfer``) keeps about each holder and each request in
flight: a holder's lacks, bytes and rate (what its batch size and the end game's stealing go by),
and a request's CIDs with what became of each (delivered, moved, skipped, on the wire)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog
import trio

from cnode.storage import CID
from cnode.storage import limits as storage_limits

from .. import limits
from .._exceptions import DialError, PeerProtocolError, StreamBroken
from .._traffic import ExchangeStats
from ._source_rate import RateWindow

__all__ = [
    "Abandoned",
    "HolderState",
    "InFlight",
    "drop_kind",
    "stalled",
    "steal_from",
    "too_slow_to_keep",
    "watch_rates",
]

log = structlog.get_logger(__name__)


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
    last_byte: float = -math.inf  # trio time of its latest byte, on any stream of the transfer

    def observed_s(self) -> float:
        """Seconds since its first request (0 before any)."""
        if self.first_request is None:
            return 0.0
        return trio.current_time() - self.first_request

    def batch_bytes(self) -> int:
        """Expected bytes to ask this holder for at once: BATCH_BLOCKS x MAX_BLOCK_SIZE, or
        what it delivers in REQUEST_TARGET_S at the rate it has shown, so that the round trips
        a request costs (its stream, then its first byte) stay small beside its transfer (and
        never more than MAX_REQUEST_CIDS blocks: ``Transfer._take_batch``)."""
        measured = int(self.rate() * limits.REQUEST_TARGET_S)
        return max(limits.BATCH_BLOCKS * storage_limits.MAX_BLOCK_SIZE, measured)

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
    sent_at: float | None = None  # trio time its REQUEST went out (the stall watch starts)

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

    def skip_to(self, index: int) -> list[CID]:
        """The holder began the block at ``index``: the CIDs it passed over (it lacks them,
        and they are this request's no more)."""
        passed = [
            c
            for c in self.cids[self.position + 1 : index]
            if c not in self.delivered and c not in self.stolen
        ]
        self.position = index
        self.skipped.update(passed)
        self.holder.lacks.update(passed)
        return passed


class Abandoned(Exception):
    """Internal: every CID this request still waits for was moved to a faster holder."""


def steal_from(
    requests: Iterable[InFlight], thief: HolderState, size: Callable[[CID], int]
) -> tuple[InFlight | None, list[CID]]:
    """End game: the request whose undelivered work ``thief`` should take, and that work.

    From a holder not faster than ``thief``: the back half of its request's unsent CIDs but
    the next one (it may be on its way already; the victim stops once only moved CIDs are
    left, so nothing is fetched twice). From a holder STEAL_SLOWER_FACTOR times slower:
    everything it has not delivered, the block on the wire included unless it arrived
    whole; its request is cancelled at once (that one partial block is wasted, and nothing
    is stored twice). A back half under MIN_SPLIT_BYTES (``size``: a block's expected bytes)
    is left where it is: moving it would cost a request more than it saves.
    """
    best: InFlight | None = None
    take: list[CID] = []
    thief_rate = thief.rate()
    for request in requests:
        victim = request.holder
        if victim is thief or victim.dropped is not None or victim.rate() > thief_rate:
            continue
        much_slower = (
            victim.observed_s() >= limits.STEAL_MIN_OBSERVED_S
            and victim.rate() * limits.STEAL_SLOWER_FACTOR < thief_rate
        )
        left = request.unsent()
        if not much_slower:
            left = left[1:]
        else:
            current = request.on_wire()
            if current is not None and current not in request.stolen:
                left = [current, *left]
        left = [c for c in left if c not in thief.lacks]
        tail = left if much_slower else left[len(left) // 2 :]
        if not much_slower and sum(size(c) for c in tail) < limits.MIN_SPLIT_BYTES:
            continue
        if len(tail) > len(take):
            best, take = request, tail
    return best, take


def drop_kind(exc: BaseException) -> str:
    """The kind of evidence a request's error is, as ExchangeStats and the logs name it."""
    if isinstance(exc, PeerProtocolError):
        return "protocol"
    if isinstance(exc, StreamBroken):
        return "stream_broken"
    if isinstance(exc, DialError):
        return "dial"
    return "too_slow"


def too_slow_to_keep(
    holders: Iterable[HolderState], stats: ExchangeStats
) -> list[tuple[HolderState, str]]:
    """The live holders to drop on their rate now, each with its reason (specs/blocks.md 13a).

    A holder under MIN_SOURCE_RATE over a whole window is dropped when another live source of
    the transfer met the rate over that window, or after LONE_SLOW_WINDOWS such windows in a
    row; otherwise it is kept and its next window begins. A slow holder is not a dead one
    (issue 41): at 16 members on one machine, holders busy scoring sent nothing for 20 s, were
    dropped as "too slow", and their updates, which nobody else held yet, were never scored.
    When every source is as slow, dropping one moves its work nowhere better: the wait is most
    likely the machine's (the holder's or our own), and the caller's deadline bounds it.
    """
    holders = list(holders)
    for holder in holders:
        holder.window.sample()
    now = trio.current_time()
    out = []
    for holder in holders:
        slow = holder.window.too_slow() if holder.dropped is None else None
        if slow is None:
            continue
        began, reason = slow
        owed = limits.MIN_SOURCE_RATE * (now - began)
        better = any(
            h.window.received_since(began) >= owed
            for h in holders
            if h is not holder and h.dropped is None
        )
        if not better:
            if holder.window.slow_windows + 1 < limits.LONE_SLOW_WINDOWS:
                holder.window.kept_slow()
                stats.slow_kept += 1
                log.info("holder_slow_kept", holder=holder.peer[-8:], reason=reason)
                continue
            reason += f", {limits.LONE_SLOW_WINDOWS} windows in a row"
        out.append((holder, reason))
    return out


def stalled(requests: Iterable[InFlight], holders: Iterable[HolderState]) -> list[InFlight]:
    """The requests to give back now (specs/blocks.md 13): no byte from their holder, on any
    stream of the transfer, for NO_PROGRESS_TIMEOUT_S since the REQUEST went out, while another
    live holder that does not lack all of it could take the work (idle, or sending bytes).

    With nowhere better to go, a request is left to run: given back, it would only be asked
    of the same holder again, on a new stream, from its start (issue 41: at 12 members on one
    machine, 852 requests were given back and 1,081 streams withdrawn, every holder starved
    alike). Its holder's rate (``too_slow_to_keep``) still bounds it.
    """
    now = trio.current_time()
    live = [h for h in holders if h.dropped is None]
    out = []
    for request in requests:
        holder = request.holder
        if request.scope is None or request.sent_at is None or request.abandoned:
            continue
        if now - max(request.sent_at, holder.last_byte) < limits.NO_PROGRESS_TIMEOUT_S:
            continue
        wanted = set(request.cids) - request.delivered - request.stolen - request.skipped
        if any(
            h is not holder
            and not wanted <= h.lacks
            and (
                h.in_flight < limits.MAX_IN_FLIGHT_PER_HOLDER
                or now - h.last_byte < limits.NO_PROGRESS_TIMEOUT_S
            )
            for h in live
        ):
            out.append(request)
    return out


async def watch_rates(
    requests: set[InFlight],
    holders: Iterable[HolderState],
    stats: ExchangeStats,
    drop: Callable[[HolderState, str, str], None],
) -> None:
    """Give back the requests :func:`stalled` names and ``drop`` the holders
    :func:`too_slow_to_keep` names, every STALL_CHECK_S (or quarter window); until cancelled."""
    while True:
        await trio.sleep(min(limits.STALL_CHECK_S, limits.SOURCE_RATE_WINDOW_S / 4))
        for request in stalled(requests, holders):
            request.scope.cancel()  # type: ignore[union-attr]  # _Stalled: CIDs go back
        for holder, reason in too_slow_to_keep(holders, stats):
            drop(holder, reason, "below_min_rate")
            # Its requests end now (TooSlowError in each worker) and their CIDs go back.
            for request in requests:
                if request.holder is holder and request.scope is not None:
                    request.scope.cancel()
