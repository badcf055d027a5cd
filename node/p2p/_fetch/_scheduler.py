"""Which holder gets which blocks: the multi-holder fetch policy (specs/blocks.md#fetching).

A :class:`Transfer` spreads a list of missing CIDs over the holders it was given. Holders are put
to work in the order given, as many as the work left needs, plus one (``needs_another_holder``),
and the next one named when none at work can take the head of the queue. Each holder at work
runs MAX_IN_FLIGHT_PER_HOLDER workers; each takes from one shared queue the next CIDs its holder
has not said it lacks, sized by their expected bytes (``_batching``): fast holders take more
work, nobody idles while work is left, a small fetch is one request. A request holds one of its
holder's ``slots`` (the node's, for all its transfers): the wait for one is not the holder's.

A slow holder is not a dead one (issue 41; specs/blocks.md 13, 13a; the rules in ``_holders``):
a quiet request is given back while another holder could take its work, and a holder dropped
only on evidence (a refusal other than BUSY, bad bytes, a broken stream...) or on its rate.

A CID is requested from a second holder only if the first did not deliver it, so nothing is
fetched twice unless its first copy was bad. End game: a worker with nothing left to take moves
the unsent tail of a slower holder's request to its own holder, or everything from one
STEAL_SLOWER_FACTOR times slower (``_holders.steal_from``): one slow holder cannot hold up the
end. Holders answer in request order and each BLOCK's CID is seen before its bytes, so every
CID passed over is lacked (back to the queue at once), and a request that starts sending a CID
already moved elsewhere is abandoned before the bytes arrive. Times come from
``trio.current_time()`` (tests run it under a MockClock).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

import structlog
import trio

from cnode.storage import CID, BlockStore, UnsyncedBatch, VerifiedBlock

from .. import limits
from .._blocks._exchange import request_then_close
from .._blocks._wire import Status
from .._exceptions import (
    BadBlockError,
    DialError,
    FetchError,
    NotAdmittedError,
    PeerProtocolError,
    RemoteRefusedError,
    StreamBroken,
    StreamOpenTimeout,
    first_error,
)
from .._traffic import ExchangeStats, current_purpose, request_kind
from ._batching import expected_bytes, needs_another_holder, preferred, take_batch, take_slot
from ._fetch_types import (
    DirectHolder,
    FetchProgress,
    FetchReport,
    OpenStream,
    RequestStream,
    Reveal,
)
from ._holders import (
    Abandoned,
    HolderState,
    InFlight,
    drop_kind,
    steal_from,
    watch_rates,
)
from ._keep import keep
from ._pool import StreamPool, ask_holder, request_sent
from ._source_rate import CountedStream

log = structlog.get_logger(__name__)


ProgressFn = Callable[[FetchProgress], None]
# slot(peer) -> the semaphore a request to that holder holds while it runs.
HolderSlots = Callable[[str], trio.Semaphore]


class _Stalled(Exception):
    """Internal: no byte from the holder for NO_PROGRESS_TIMEOUT_S; the request goes back."""


class Transfer:
    """Fetch state shared by every round of one ``fetch`` (holders stay dropped across rounds).

    Args:
        store: where verified blocks are put.
        open_stream: ``await open_stream(peer)`` gives a stream to that holder (DialError,
            StreamBroken on failure).
        holders: peer ids to fetch from.
        progress: called after every stored block.
        direct: holders reached without a libp2p stream (gateways), by name; their names
            are holders too and share the queue, the stealing and the drop rules.
        reveal: called with each stored block (in the storing thread); the CIDs it returns
            join the queue during the fetch, nodes at the front, leaves at the back, so a
            manifest is fetched in one pass as its nodes arrive.
        batch: an open ``store.begin_unsynced()`` batch: blocks are then stored without a
            per-block fsync, and the caller commits the batch (specs/blocks.md#durability).
        slots: ``slots(peer)``, the node's semaphore per holder (MAX_STREAMS_PER_HOLDER),
            held by every request to it while it runs. None: this transfer's own.
        stats: where request timings and drops are counted (the node's ExchangeStats).
        pool: the node's idle streams (``_pool``): a request takes one to its holder if there
            is one, and a request that ended cleanly gives its stream back. None: every
            request opens a new stream and closes it.
        sizes: ``sizes(cid)``, a block's expected bytes if known (``ClosureWalk.expected_size``).
        root: the manifest root, for ExchangeStats.by_purpose (None: the first CID fetched).
    """

    def __init__(
        self,
        store: BlockStore,
        open_stream: OpenStream,
        holders: Iterable[str],
        progress: ProgressFn | None = None,
        direct: Iterable[DirectHolder] = (),
        reveal: Reveal | None = None,
        batch: UnsyncedBatch | None = None,
        slots: HolderSlots | None = None,
        stats: ExchangeStats | None = None,
        pool: StreamPool | None = None,
        sizes: Callable[[CID], int | None] | None = None,
        root: CID | None = None,
    ) -> None:
        self.store = store
        self._size = expected_bytes(sizes)
        self.stats = stats if stats is not None else ExchangeStats()
        own: dict[str, trio.Semaphore] = {}
        self.slots = slots or (
            lambda peer: own.setdefault(peer, trio.Semaphore(limits.MAX_IN_FLIGHT_PER_HOLDER))
        )
        self.reveal = reveal
        self.batch = batch
        self.open_stream = open_stream
        self.pool = pool
        self.direct = {d.name: d for d in direct}
        self.holders = {peer: HolderState(peer) for peer in [*holders, *self.direct]}
        self.progress = progress
        self.started = trio.current_time()
        self.bytes = 0
        self.blocks = 0
        self._pending: collections.deque[CID] = collections.deque()
        self._in_flight: set[CID] = set()
        self._requests: set[InFlight] = set()
        self._stored: set[CID] = set()  # by any holder (a moved CID may arrive twice)
        self._changed = trio.Event()
        self._at_work: list[HolderState] = []  # holders whose workers run, in the order given
        self._waiting: collections.deque[HolderState] = collections.deque()  # not yet at work
        self._nursery: trio.Nursery | None = None
        self._root, self._purpose = root, current_purpose()  # for ExchangeStats.by_purpose

    # -- shared queue ------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _take_batch(self, holder: HolderState) -> list[CID]:
        batch = take_batch(self._pending, self._at_work, holder, self._size, self.slots)
        self._in_flight.update(batch)
        return batch

    def _steal(self, thief: HolderState) -> list[CID]:
        """End game: move a slower holder's undelivered work to ``thief`` (``steal_from``);
        a victim that starts sending a moved CID is abandoned at its header (``_request``)."""
        best, take = steal_from(self._requests, thief, self._size)
        if best is not None:
            best.stolen.update(take)
            log.debug("work_moved", blocks=len(take), src=best.holder.peer, dst=thief.peer)
            if best.only_stolen_left() and best.scope is not None:
                best.abandoned = True
                best.scope.cancel()
        return take

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(
                FetchProgress(
                    bytes=self.bytes,
                    blocks=self.blocks,
                    pending=len(self._pending) + len(self._in_flight),
                    holders_in_use=sum(1 for h in self.holders.values() if h.in_flight),
                    elapsed_s=trio.current_time() - self.started,
                )
            )

    # -- one round ---------------------------------------------------------------------------

    async def fetch_synced(self, cids: Iterable[CID]) -> None:
        """:meth:`fetch`, then the batch (if any) committed, even on error (blocks.md D3)."""
        try:
            await self.fetch(cids)
        finally:
            if self.batch is not None:
                with trio.CancelScope(shield=True):  # a sync takes the disk's time, bounded
                    await trio.to_thread.run_sync(self.batch.commit)

    async def fetch(self, cids: Iterable[CID]) -> None:
        """Fetch every CID in ``cids`` from the live holders, or raise FetchError.

        Blocks stored before a FetchError stay stored (a later fetch resumes from them).
        """
        self._pending = collections.deque(dict.fromkeys(cids))
        if self._root is None and self._pending:
            self._root = self._pending[0]
        self._in_flight = set()
        self._requests = set()
        live = [h for h in self.holders.values() if h.dropped is None]
        if self._pending and live:
            try:
                async with trio.open_nursery() as watching:
                    watching.start_soon(
                        watch_rates, self._requests, self.holders.values(), self.stats, self._drop
                    )
                    async with trio.open_nursery() as self._nursery:
                        self._at_work, self._waiting = [], collections.deque(live)
                        self._put_to_work()
                    watching.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # What a worker could not handle (the reveal hook's ManifestError, a store that
                # cannot write): the caller gets that error itself, not a group of it.
                raise first_error(group) from None
        if self._pending:
            # Keyed by the whole peer id or URL (two gateway URLs may end alike).
            reasons = {h.peer: h.dropped or "lacks them" for h in self.holders.values()}
            raise FetchError(
                f"{len(self._pending)} blocks could not be fetched from any holder "
                f"(holders: {reasons or 'none'}); {self.blocks} blocks fetched are kept",
                missing=len(self._pending),
                fetched=self.blocks,
                refused_by=frozenset(h.peer for h in self.holders.values() if h.refused),
            )

    def _put_to_work(self) -> None:
        """Start the workers of the next holders named while the queue needs them."""
        assert self._nursery is not None
        while self._waiting and needs_another_holder(self._pending, self._at_work, self._size):
            holder = self._waiting.popleft()
            if holder.dropped is None:
                self._at_work.append(holder)
                for _ in range(limits.MAX_IN_FLIGHT_PER_HOLDER):
                    self._nursery.start_soon(self._worker, holder)

    async def _worker(self, holder: HolderState) -> None:
        while holder.dropped is None:
            self._put_to_work()  # the queue grew (a manifest node revealed its children)
            # The holder's slot first, then the work: CIDs are never held by a worker that
            # waits, and the wait for a slot (our own queue) is not counted against the holder.
            slot = self.slots(holder.peer)
            await take_slot(slot)
            try:
                batch = [] if holder.dropped else self._take_batch(holder) or self._steal(holder)
                if batch:
                    await self._one_request(holder, batch)
                    continue
            finally:
                slot.release()
            self._put_to_work()  # it lacks the head, perhaps as every holder at work does
            # Nothing to take now: wait for a request in flight (a failure or a lack puts work
            # back) or for the likelier holder work was left to (it may lack it), or stop.
            if not self._in_flight and not preferred(
                self._pending, self._at_work, holder, self.slots
            ):
                return
            await self._changed.wait()
        self._put_to_work()  # dropped: the next holder named takes its place

    async def _one_request(self, holder: HolderState, batch: list[CID]) -> None:
        request = InFlight(holder, batch)
        self._requests.add(request)
        holder.in_flight += 1
        if holder.first_request is None:
            holder.first_request = trio.current_time()
        lacked: set[CID] = set()
        owed = False  # given back unfinished: the holder still owes it (its window runs on)
        try:
            lacked = await self._request(request)
        except Abandoned:
            pass  # its remaining blocks now belong to faster holders
        except (_Stalled, StreamOpenTimeout) as exc:
            # Quiet, or too busy to open a stream (its connection up): given back, kept.
            owed = isinstance(exc, _Stalled)
            self.stats.stalls += 1
            log.info("request_stalled", holder=holder.peer[-8:], blocks=len(batch), why=str(exc))
        except BadBlockError as exc:
            self._drop(holder, f"bad bytes: {exc}", "bad_bytes")
            log.error(
                "holder_sent_bad_block",
                holder=holder.peer,
                claimed=exc.claimed,
                computed=exc.computed,
                evidence="bytes received for the claimed CID hash to the computed CID",
            )
        except (RemoteRefusedError, NotAdmittedError) as exc:
            if isinstance(exc, RemoteRefusedError) and exc.status == int(Status.BUSY):
                # Backpressure, not a fault: the holder serves as much as it can for us.
                owed = True
                log.info("holder_busy", holder=holder.peer[-8:])
                await trio.sleep(limits.BUSY_RETRY_S)
            else:
                holder.refused = isinstance(exc, NotAdmittedError) or exc.status == int(
                    Status.FORBIDDEN
                )
                self._drop(holder, f"{type(exc).__name__}: {exc}", "refused")
        except (PeerProtocolError, StreamBroken, DialError, trio.TooSlowError) as exc:
            kind = drop_kind(exc)
            self._drop(holder, f"{type(exc).__name__}: {exc}", kind)
        finally:
            self._requests.discard(request)
            holder.in_flight -= 1
            if not holder.in_flight and not owed:
                holder.window.idle()
            holder.lacks |= lacked
            # Taken CIDs are the taker's now, skipped ones went back to the queue already:
            # neither is done nor returned here.
            mine = [c for c in batch if c not in request.stolen and c not in request.skipped]
            self._in_flight.difference_update(mine)
            back = [cid for cid in mine if cid not in self._stored]
            self._pending.extendleft(reversed(back))
            self._notify()

    def _enqueue(self, nodes: list[CID], leaves: list[CID]) -> None:
        known = self._stored | self._in_flight
        nodes = [c for c in nodes if c not in known]
        leaves = [c for c in leaves if c not in known]
        if not nodes and not leaves:
            return
        self._pending.extendleft(reversed(nodes))
        self._pending.extend(leaves)
        self._notify()

    def _drop(self, holder: HolderState, reason: str, kind: str) -> None:
        if holder.dropped is None:
            holder.dropped = reason
            self.stats.holder_dropped(kind)
            log.warning("holder_dropped", holder=holder.peer, reason=reason, kind=kind)

    def _progress(self, holder: HolderState, received: int) -> None:
        """Bytes (or a frame) arrived from ``holder``: every request of this transfer to it is
        alive, not only the one whose stream they came on (its other stream may be waiting its
        turn at the holder, behind this one)."""
        holder.window.add(received)
        holder.last_byte = trio.current_time()

    def _skip(self, request: InFlight, index: int) -> None:
        """The holder began the block at ``index``: what it passed over goes back at once."""
        passed = request.skip_to(index)
        if passed:
            self._in_flight.difference_update(passed)
            self._pending.extendleft(reversed([c for c in passed if c not in self._stored]))
            self._notify()

    async def _delivered(self, request: InFlight, block: VerifiedBlock) -> None:
        """One verified block of ``request`` arrived: store it and count it."""
        cid, data = block.cid, block.data
        if cid in request.stolen:  # moved while its last bytes were being checked
            raise Abandoned
        request.arrived.add(cid)  # (a gateway has no arrival hook: marked here too)
        # Hashed once on receipt (request_blocks); stored on the loop's thread if small.
        nodes, leaves = await keep(self.store, block, self.batch, self.reveal)
        self._enqueue(nodes, leaves)  # before cid leaves _in_flight: no worker stops early
        request.delivered.add(cid)
        self._stored.add(cid)
        self._in_flight.discard(cid)  # done: no longer pending anywhere
        request.holder.bytes += len(data)
        self.bytes += len(data)
        self.blocks += 1
        self._report()
        if request.stolen and request.only_stolen_left():
            raise Abandoned

    async def _request(self, request: InFlight) -> set[CID]:
        holder = request.holder
        index = {cid: i for i, cid in enumerate(request.cids)}

        def on_block_start(cid: CID) -> None:
            self._skip(request, index[cid])
            if cid in request.stolen:
                # It lacked what came before, and this one was moved: do not receive it twice.
                log.debug("moved_block_started", holder=holder.peer, cid=str(cid))
                raise Abandoned

        async def on_block(block: VerifiedBlock) -> None:
            await self._delivered(request, block)

        began = trio.current_time()
        first_byte: float | None = None
        received = 0

        def on_bytes(n: int) -> None:
            # Progress is bytes, not whole frames: a 1 MiB block arriving slowly is progress.
            nonlocal first_byte, received
            if n and first_byte is None:
                first_byte = trio.current_time()
            received += n
            self._progress(holder, n)

        def on_frame(n: int = 0) -> None:
            self._progress(holder, n)

        try:
            with trio.CancelScope() as scope:
                request.scope = scope
                # Opening the stream (and showing our token) has its own, longer bound: the
                # holder owes nothing until the REQUEST is on the wire, so neither the
                # no-progress timer nor its rate window runs before (issue 41: at 16 members
                # busy holders were dropped for "0 bytes in 20 s" still opening streams).
                scope.deadline = began + limits.OPEN_TIMEOUT_S
                direct = self.direct.get(holder.peer)
                if direct is not None:
                    request_sent(request)

                    def on_piece(n: int) -> None:
                        if n:
                            on_bytes(n)
                        else:
                            on_frame()

                    return await direct.request(request.cids, on_block, on_piece, on_block_start)

                async def ask(stream: RequestStream, pooled: Callable[[], bool]) -> set[CID]:
                    counted = CountedStream(stream, on_bytes)
                    args = (on_block, on_frame, on_block_start, request.arrived.add, pooled)
                    return await request_then_close(stream, counted, request.cids, *args)

                return await ask_holder(
                    self.pool, self.open_stream, request, ask, lambda: received > 0
                )
        finally:
            now = trio.current_time()
            opened = began if request.sent_at is None else request.sent_at  # its stream in hand
            ttfb = None if first_byte is None else first_byte - opened
            kind = request_kind(self._purpose, self._root, request.cids)
            self.stats.request_done(
                opened - began, ttfb, now - began, received, kind, len(request.cids)
            )
        if request.abandoned:
            raise Abandoned
        if holder.dropped is not None:
            raise trio.TooSlowError(holder.dropped)
        raise _Stalled(f"no byte for {limits.NO_PROGRESS_TIMEOUT_S} s")

    def report(self, root: CID) -> FetchReport:
        return FetchReport(
            root=root,
            blocks=self.blocks,
            bytes=self.bytes,
            seconds=trio.current_time() - self.started,
            per_holder_bytes={p: h.bytes for p, h in self.holders.items() if h.bytes},
            dropped={p: h.dropped for p, h in self.holders.items() if h.dropped},
        )
