"""The node: one libp2p host with block exchange, fetch scheduler and announcements.

:func:`open_p2p_node` (``_open.py``) runs one for trio callers (the training loop, the CLI);
asyncio callers (the coordinator) reach it through :mod:`._bridge`.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import structlog
import trio
from libp2p.custom_types import TProtocol
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from cnode.auth import Opened, seal
from cnode.storage import CID, BlockStore, ClosureWalk

from . import _defects, limits
from ._blocks._admission import PeerAdmission, present_token
from ._blocks._server import BlockServer
from ._blocks._stream import Libp2pStream, selection_timed_out
from ._blocks._wire import ADMIT_PROTOCOL_ID, PROTOCOL_ID, Status
from ._bucket import TokenBucket
from ._exceptions import (
    AnnouncementError,
    DialError,
    NotAdmittedError,
    P2PError,
    PeerProtocolError,
    RejectedMessage,
    RemoteRefusedError,
    StreamBroken,
    StreamOpenTimeout,
)
from ._fetch._fetch_types import DirectHolder, FetchReport
from ._fetch._pool import StreamPool
from ._fetch._scheduler import ProgressFn, Transfer
from ._gossip._announce import (
    PAYLOAD_TYPE,
    AnnounceKind,
    Announcement,
    EnvelopeValidator,
    HolderTable,
    announce_topic,
    announcement_validator,
)
from ._gossip._repeat import HeldManifests, repeat_holds
from ._gossip._subscription import Subscription
from ._reach import DialMemory
from ._settings import NodeIdentity, P2PSettings, peer_info

log = structlog.get_logger(__name__)


class P2PNode:
    """A running node; get one from :func:`open_p2p_node`, never construct it directly."""

    def __init__(
        self,
        identity: NodeIdentity,
        store: BlockStore,
        settings: P2PSettings,
        host: Any,
        pubsub: Pubsub,
        server: BlockServer,
        nursery: trio.Nursery,
        admission: PeerAdmission | None = None,
    ) -> None:
        self.identity = identity
        self.admission = admission
        self.store = store
        self.settings = settings
        self.server = server
        self.traffic = server.traffic  # bytes by peer, both ways: the node's /metrics
        self._host = host
        self._pubsub = pubsub
        self._nursery = nursery
        self._table = HolderTable()
        self._pacer = TokenBucket(limits.PUBLISH_MAX_PER_S, burst=8)
        self._topics: dict[str, tuple[EnvelopeValidator, list[Subscription]]] = {}
        self._validated: collections.OrderedDict[bytes, Opened] = collections.OrderedDict()
        self._counter = 0
        # Manifests announced with announce_hold (and their layers), said again to newcomers.
        self._holding = HeldManifests()
        self._holder_slots: dict[str, trio.Semaphore] = {}  # per holder, for all transfers
        self.pool = StreamPool(self._show_token)  # idle streams by holder; closed on stop
        self.peer_id: str = identity.peer_id_str
        # Outbound-only peers and failed dials: never dialed by a fetch (``_reach``).
        self.reach = DialMemory()
        self.listen_addrs: list[str] = [str(a) for a in host.get_addrs()]

    # -- peers and blocks ------------------------------------------------------------------

    async def connect(self, address: str) -> str:
        """Dial ``address`` (a multiaddr ending in ``/p2p/PEER``); return the peer id.

        Error handling: DialError naming the address when it is malformed or the dial or
        handshake fails (a peer without Noise + yamux fails here).
        """
        info = peer_info(address)
        _defects.forget_failed_dial(self._host.get_network(), info.peer_id)
        _defects.dial_given_address(self._host, info.peer_id)
        try:
            await self._host.connect(info)
        except BaseLibp2pError as exc:
            raise DialError(f"cannot connect to {address}: {exc}") from exc
        self.reach.connected(str(info.peer_id))
        return str(info.peer_id)

    def is_connected(self, peer: str) -> bool:
        try:
            return bool(self._host.get_network().get_connections(ID.from_base58(peer)))
        except ValueError:
            return False

    def connected_peers(self) -> list[str]:
        return [str(p) for p in self._host.get_connected_peers()]

    async def _new_stream(self, peer: str, protocol: str) -> Libp2pStream:
        # Over an open connection (either side opened it) a stream needs no dial; without one,
        # a peer that cannot be dialed is not (issue 37: each such dial waited out a timeout).
        connected = self.is_connected(peer)
        if not connected:
            why = self.reach.why_not(peer)
            if why is not None:
                self.reach.dials_avoided += 1
                raise DialError(f"not dialing {peer[-8:]}: {why}")
        try:
            peer_id = ID.from_base58(peer)
            _defects.forget_failed_dial(self._host.get_network(), peer_id)
            raw = await self._host.new_stream(peer_id, [TProtocol(protocol)])
        except (BaseLibp2pError, ValueError) as exc:
            what = f"cannot open a {protocol} stream to {peer[-8:]}: {exc}"
            if connected and selection_timed_out(exc):
                # Its connection is up; it did not answer in STREAM_NEGOTIATION_TIMEOUT_S: busy,
                # not unreachable (issue 41), so no failed dial is remembered either.
                raise StreamOpenTimeout(f"{what} (protocol selection timed out)") from exc
            if not connected:
                self.reach.failed(peer, str(exc)[:200])
            raise DialError(what) from exc
        return Libp2pStream(raw, peer)

    async def _open_stream(self, peer: str) -> Libp2pStream:
        await self._show_token(peer)
        return await self._new_stream(peer, PROTOCOL_ID)

    async def _show_token(self, holder: str) -> None:
        """Show ``holder`` our access token once per token, in a run that admits peers
        (specs/blocks.md#admission), before any request (on a new stream or an idle one).
        Error handling: NotAdmittedError when refused, StreamOpenTimeout when it is busy."""
        admission = self.admission
        if admission is None:
            return
        async with admission.lock(holder):
            # The muxed connections, as ``shown`` records them (a stream's ``muxed_conn``): the
            # swarm's wrappers never matched (11,341 admissions at 16 members, issue 41).
            live = [
                getattr(conn, "muxed_conn", conn)
                for conn in self._host.get_network().get_connections(ID.from_base58(holder))
            ]
            token = admission.to_show(holder, live)
            if token is None:
                return
            began = trio.current_time()
            self.traffic.exchange.tokens_shown += 1
            stream = await self._new_stream(holder, ADMIT_PROTOCOL_ID)
            # Once sent, the token's answer is awaited (ADMIT_TIMEOUT_S) even if its request is
            # given back meanwhile: cut off, the holder admitted us for nothing and the next
            # request showed the token again (up to 8 times for one pair at 16 members).
            with trio.CancelScope(shield=True):
                try:
                    expires_at = await present_token(stream, holder, token)
                    await stream.close()
                except (RemoteRefusedError, PeerProtocolError, StreamBroken) as exc:
                    await stream.reset()
                    if isinstance(exc, RemoteRefusedError) and exc.status == int(Status.BUSY):
                        raise StreamOpenTimeout(f"{holder[-8:]} was busy: {exc}") from exc
                    raise NotAdmittedError(f"{holder[-8:]} did not admit us: {exc}") from exc
                except trio.TooSlowError as exc:
                    await stream.reset()
                    raise StreamOpenTimeout(
                        f"{holder[-8:]} did not answer our access token in time"
                    ) from exc
                admission.shown(holder, expires_at, stream.raw.muxed_conn)
                self.traffic.exchange.admit_s += trio.current_time() - began
            await trio.lowlevel.checkpoint()  # a cancel that arrived meanwhile, now

    def _slot(self, holder: str) -> trio.Semaphore:
        """The semaphore every request to ``holder`` holds while it runs (all transfers)."""
        if len(self._holder_slots) >= limits.MAX_HOLDER_TABLE_CIDS:  # forget the idle ones
            most = limits.MAX_STREAMS_PER_HOLDER
            self._holder_slots = {p: s for p, s in self._holder_slots.items() if s.value < most}
        if holder not in self._holder_slots:  # not setdefault: a new Semaphore at every request
            self._holder_slots[holder] = trio.Semaphore(limits.MAX_STREAMS_PER_HOLDER)
        return self._holder_slots[holder]

    def holders(self, cid: CID, layer: str | None = None) -> set[str]:
        """Peers that announced they hold every block of ``cid`` (and have not departed);
        with ``layer``, also those that announced holding that layer of it."""
        return self._table.holders(cid, layer)

    def note_holder(self, peer: str, cid: CID) -> None:
        """Record ``peer`` as a holder of every ``cid`` block (an update header says so)."""
        self._table.add(peer, cid, None)

    async def fetch(
        self,
        root: CID,
        holders: Sequence[str] | None = None,
        *,
        progress: ProgressFn | None = None,
        gateways: Sequence[DirectHolder] = (),
        layers: Collection[str] | None = None,
    ) -> FetchReport:
        """Fetch ``root`` and every block it needs that the store lacks; verify each.

        Holders: ``holders`` plus every peer that announced ``root``, partial holders included
        (they answer LACKING for what they lack, and are not asked for it again); if both are
        empty, every connected peer. ``gateways`` (trustless HTTP gateways, specs/gateway.md)
        are holders too, sharing the same queue. One pass over the manifest tree
        (``storage.ClosureWalk``): held nodes are read once, each fetched node is parsed from
        the bytes received, its missing children queued at once (``layers``: only their chunks).

        Error handling: FetchError when some block cannot be had from any holder; every block
        stored until then stays stored, so calling fetch again resumes.
        """
        walk = ClosureWalk(self.store, root, layers)
        nodes, leaves = await trio.to_thread.run_sync(walk.start)
        # Fetched blocks are fsynced together, once, before fetch returns or raises
        # (specs/blocks.md#durability); a crash before that leaves a marker the store checks.
        batch = None
        if nodes or leaves:
            batch = await trio.to_thread.run_sync(self.store.begin_unsynced)
        transfer = Transfer(
            self.store,
            self._open_stream,
            self._sources([root], holders),
            progress,
            gateways,
            reveal=lambda block: walk.arrived(block.cid, block.data),
            batch=batch,
            slots=self._slot,
            stats=self.traffic.exchange,
            pool=self.pool,
            sizes=walk.expected_size,  # requests sized by the bytes the manifest says
            root=root,
        )
        if batch is not None:
            await transfer.fetch_synced([*nodes, *leaves])
        report = self.traffic.fetched(transfer.report(root))
        log.info(
            "fetch_done",
            root=str(root),
            blocks=report.blocks,
            bytes=report.bytes,
            mb_per_s=round(report.mb_per_s, 1),
            holders=len(report.per_holder_bytes),
            dropped=len(report.dropped),
            nodes_read=walk.nodes_read,
        )
        return report

    async def fetch_blocks(
        self,
        cids: Sequence[CID],
        holders: Sequence[str] | None = None,
        *,
        progress: ProgressFn | None = None,
    ) -> FetchReport:
        """Fetch these blocks themselves (not what they link to: signed update headers, say);
        verify each. Holders and errors as :meth:`fetch`; blocks already held are not asked for.
        """
        if not cids:
            raise ValueError("fetch_blocks needs at least one CID")
        wanted = [cid for cid in dict.fromkeys(cids) if not self.store.has(cid)]
        # Several blocks (a partition's chunks): fsynced together, as :meth:`fetch` does; one
        # block (a header) keeps its own fsync, cheaper than a batch's marker and sync.
        batch = await trio.to_thread.run_sync(self.store.begin_unsynced) if wanted[1:] else None
        transfer = Transfer(
            self.store,
            self._open_stream,
            self._sources(cids, holders),
            progress,
            batch=batch,
            slots=self._slot,
            stats=self.traffic.exchange,
            pool=self.pool,
        )
        if wanted:
            await transfer.fetch_synced(wanted)
        return self.traffic.fetched(transfer.report(cids[0]))

    def _sources(self, cids: Sequence[CID], holders: Sequence[str] | None) -> list[str]:
        """``holders`` in the caller's order (the likeliest first, asked first: blocks.md 12), then
        all that announced ``cids`` (partial holders too); if none, every connected peer."""
        order = list(dict.fromkeys(holders or ()))
        order += sorted({p for cid in cids for p in self._table.announced(cid)} - set(order))
        order = order or sorted(self.connected_peers())
        peers = set(order) - {self.peer_id}
        # A holder we may not dial and are not connected to is no holder for this fetch: its
        # blocks come from those that re-serve them (issue 37).
        usable = {p for p in peers if self.is_connected(p) or self.reach.why_not(p) is None}
        if usable != peers:
            self.reach.dials_avoided += len(peers - usable)
            log.debug("holders_not_dialed", holders=sorted(p[-8:] for p in peers - usable))
        return [p for p in order if p in usable]

    # -- pubsub ----------------------------------------------------------------------------

    async def publish(self, topic: str, envelope_bytes: bytes) -> None:
        """Publish an auth envelope on ``topic``, paced under py-libp2p's silent-drop limits.

        Error handling: AnnouncementError if the message is over MAX_ANNOUNCEMENT_SIZE
        (gossipsub would drop it without a word).
        """
        if len(envelope_bytes) > limits.MAX_ANNOUNCEMENT_SIZE:
            raise AnnouncementError(
                f"message of {len(envelope_bytes)} bytes exceeds MAX_ANNOUNCEMENT_SIZE "
                f"{limits.MAX_ANNOUNCEMENT_SIZE}"
            )
        await self._pacer.take(1)
        try:
            await self._pubsub.publish(topic, envelope_bytes)
        except BaseLibp2pError as exc:
            raise P2PError(f"publish on {topic} failed: {exc}") from exc

    def subscribe(self, topic: str, validator: EnvelopeValidator) -> Subscription:
        """Messages on ``topic`` that ``validator`` accepts, as :class:`Opened` envelopes.

        Use as ``async with node.subscribe(t, v) as sub: async for opened in sub: ...``.
        One validator per topic: a second subscriber must pass the same validator object.
        """
        current = self._topics.get(topic)
        if current is not None and current[0] is not validator:
            raise P2PError(f"topic {topic} already has a different validator")
        return Subscription(self, topic, validator)

    async def _join(self, sub: Subscription) -> None:
        if sub.topic in self._topics:
            self._topics[sub.topic][1].append(sub)
            return
        self._topics[sub.topic] = (sub.validator, [sub])
        self._pubsub.set_topic_validator(
            sub.topic, self._topic_validator(sub.topic, sub.validator), False
        )
        libp2p_sub = await self._pubsub.subscribe(sub.topic)
        self._nursery.start_soon(self._pump, sub.topic, libp2p_sub)

    def _leave(self, sub: Subscription) -> None:
        entry = self._topics.get(sub.topic)
        if entry is not None and sub in entry[1]:
            entry[1].remove(sub)

    def _topic_validator(
        self, topic: str, validator: EnvelopeValidator
    ) -> Callable[[ID, rpc_pb2.Message], bool]:
        def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            source = str(ID(msg.from_id))
            try:
                opened = validator.validate(msg.data, source)
            except RejectedMessage as exc:
                log.warning(
                    "pubsub_message_dropped",
                    topic=topic,
                    source=source[-8:],
                    forwarder=str(forwarder)[-8:],
                    reason=str(exc),
                )
                return False
            self._validated[msg.from_id + msg.seqno] = opened
            while len(self._validated) > limits.SUBSCRIBER_BUFFER:
                self._validated.popitem(last=False)
            return True

        return validate

    async def _pump(self, topic: str, libp2p_sub: Any) -> None:
        # Drain py-libp2p's 32-message subscription queue at once into our own buffers.
        while True:
            msg = await libp2p_sub.get()
            opened = self._validated.pop(msg.from_id + msg.seqno, None)
            if opened is None:
                continue  # validated long ago and evicted: nothing safe to deliver
            for sub in list(self._topics.get(topic, (None, []))[1]):
                sub._deliver(opened)

    # -- announcements ---------------------------------------------------------------------

    def _next_counter(self) -> int:
        # Strictly increasing, also across restarts (replay guards remember the last one).
        self._counter = max(self._counter + 1, time.time_ns())
        return self._counter

    async def _announce(self, kind: AnnounceKind, **fields: Any) -> None:
        run = self.settings.run_id
        if run is None:
            raise AnnouncementError("announcements need P2PSettings.run_id")
        ann = Announcement(run, kind, self._next_counter(), int(time.time()), **fields)
        await self.publish(announce_topic(run), seal(self.identity, PAYLOAD_TYPE, ann.to_payload()))

    async def announce_hold(self, root: CID, layers: Sequence[str] | None = None) -> None:
        """Tell the run we hold manifest ``root`` (all its blocks, or only ``layers``).

        The node repeats it while the store still has ``root``, so peers that join later learn
        of it too (the MAX_REANNOUNCED_HOLDS latest manifests; when: ``_gossip._repeat``).
        """
        held = None if layers is None else tuple(layers)
        self._holding.add(root, held)
        await self._announce(AnnounceKind.HOLD, cid=root, layers=held)
        log.info("hold_announced", manifest=str(root), layers=None if held is None else len(held))

    async def announce_departure(self) -> None:
        """Tell the run we are leaving (peers forget us as a holder; we stop re-announcing)."""
        self._holding.clear()
        await self._announce(AnnounceKind.DEPARTURE)

    async def _reannounce_holds(self) -> None:
        # Each repeat is a new announcement (new counter and clock): replay guards pass it.
        topic = announce_topic(self.settings.run_id or "")

        def subscribers() -> list[str]:
            return [str(p) for p in self._pubsub.peer_topics.get(topic, ())]

        async def sweep() -> None:
            for root, layers in self._holding:
                if not await trio.to_thread.run_sync(self.store.has, root):
                    self._holding.discard(root)
                    log.info("hold_no_longer_announced", manifest=str(root), reason="not in store")
                    continue
                try:
                    await self._announce(AnnounceKind.HOLD, cid=root, layers=layers)
                except P2PError as exc:
                    log.info("reannounce_failed", manifest=str(root), error=str(exc))

        await repeat_holds(self._holding, subscribers, sweep)

    async def _follow_announcements(self, run: str, allow: Callable[[str], bool]) -> None:
        # Our own announcements pass our own validator too (py-libp2p validates local
        # publishes): a holder that serves only some peers must still be able to announce.
        validator = announcement_validator(run, lambda peer: peer == self.peer_id or allow(peer))
        async with self.subscribe(announce_topic(run), validator) as sub:
            async for opened in sub:
                self._table.apply(opened.signer, Announcement.from_payload(opened.payload))
