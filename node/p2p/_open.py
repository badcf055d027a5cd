"""Running a node: build its libp2p host (defects mended, handlers set) and run it, with its
pubsub and background tasks, for the duration of an ``async with`` block.

:func:`open_p2p_node` is the whole public surface for trio callers (the training loop, the CLI).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import structlog
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from cnode.storage import BlockStore

from . import _defects
from ._blocks._admission import PeerAdmission, serve_admit
from ._blocks._server import BlockServer
from ._blocks._stream import Libp2pStream
from ._blocks._wire import ADMIT_PROTOCOL_ID, PROTOCOL_ID
from ._bucket import TokenBucket
from ._exceptions import DialError, ListenError, P2PError, StreamBroken
from ._node import P2PNode
from ._settings import NodeIdentity, P2PSettings

__all__ = ["open_p2p_node"]

log = structlog.get_logger(__name__)


@asynccontextmanager
async def open_p2p_node(
    identity: NodeIdentity,
    store: BlockStore,
    settings: P2PSettings,
    *,
    allow: Callable[[str], bool],
    admission: PeerAdmission | None = None,
) -> AsyncIterator[P2PNode]:
    """Run a node for the duration of the ``async with`` block (trio only).

    Args:
        identity: the node's key (``cnode.auth.Identity``); its peer id is the host's.
        store: blocks served to others and filled by ``fetch``.
        settings: listen addresses, bootstrap peers, upload cap, run id.
        allow: ``allow(peer_id) -> bool``: who may fetch blocks from us and whose
            announcements we accept (e.g. not banned).
        admission: in a run, the access-token policy: peers must also show a valid token
            (``/cnode/admit/1.0.0``) before they fetch, and this node shows its own to every
            holder before it fetches. None: ``allow`` alone decides (``cnode checkpoint serve``).

    Resource handling: the host, pubsub, and every background task live in a nursery that
    closes with the block; a departure is announced (best effort, 1 s) on the way out.
    An error raised in the block comes out as itself when it is the only one (not wrapped in
    an ExceptionGroup); py-libp2p's shutdown race is dropped.
    Error handling: ListenError for a listen address that is malformed or already in use;
    bootstrap peers that cannot be reached are logged and skipped.
    """
    host, pubsub, router, server, addrs = _build_host(identity, store, settings, allow, admission)
    to_raise: BaseException | None = None
    try:
        async with (
            host.run(addrs),
            background_trio_service(pubsub),
            background_trio_service(router),
            trio.open_nursery() as nursery,
        ):
            await pubsub.wait_until_ready()
            node = P2PNode(identity, store, settings, host, pubsub, server, nursery, admission)
            log.info("p2p_node_started", peer=node.peer_id[-8:], listen=node.listen_addrs)
            for address in settings.bootstrap:
                try:
                    with trio.fail_after(10):
                        await node.connect(address)
                except (DialError, trio.TooSlowError) as exc:
                    log.warning("bootstrap_peer_unreachable", address=address, error=str(exc))
            if settings.run_id is not None:
                nursery.start_soon(node._follow_announcements, settings.run_id, allow)
                nursery.start_soon(node._reannounce_holds)
            nursery.start_soon(node.pool.run_sweeps)
            try:
                yield node
            finally:
                await _wind_down(node)
                if settings.run_id is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        try:
                            await node.announce_departure()
                        except P2PError as exc:
                            log.info("departure_not_announced", error=str(exc))
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Trio wraps every error in groups; py-libp2p adds a shutdown race (defect 8).
        to_raise = _defects.clean_group(group)
        if to_raise is None:
            log.info("p2p_teardown_race_ignored")
    finally:
        # py-libp2p leaves its TCP listeners open when host.run ends (defect 7).
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await _defects.close_listeners(host.get_network())
    if to_raise is not None:
        raise to_raise


async def _wind_down(node: P2PNode) -> None:
    """Log where the node's exchange spent its time (bench/swarm_size.py reads it); close its
    idle streams (bounded: the node is stopping)."""
    pool = node.pool
    log.info(
        "exchange_totals",
        **node.traffic.exchange.summary(),
        streams_opened=pool.opened,
        streams_reused=pool.reused,
        pooled_replaced=pool.replaced,
    )
    with trio.CancelScope(shield=True), trio.move_on_after(2):
        await pool.close_all()


def _build_host(
    identity: NodeIdentity,
    store: BlockStore,
    settings: P2PSettings,
    allow: Callable[[str], bool],
    admission: PeerAdmission | None,
) -> tuple[IHost, Pubsub, Any, BlockServer, list[multiaddr.Multiaddr]]:
    """The host with py-libp2p's defects mended (``_defects``), its block server and admission
    handlers, its pubsub and router, and the listen addresses parsed (ListenError if bad)."""
    _defects.remove_dial_delay()
    _defects.bound_stream_resets()
    _defects.fit_yamux_frames()
    _defects.buffer_tcp_reads()
    _defects.batch_window_updates()
    _defects.pipeline_protocol_select()
    _defects.atomic_frame_writes()
    _defects.window_updates_at_half_window()  # defects 21-24: per-RPC and per-read costs
    _defects.remember_sender_records()
    _defects.buffer_pubsub_reads()
    _defects.reuse_local_record()
    key_pair = identity.key_pair()
    host = new_host(
        key_pair=key_pair,
        sec_opt=_defects.secure_transports(key_pair),
        muxer_opt=_defects.muxers(),
    )
    _defects.release_inbound_slots(host.get_network())
    _defects.switch_off_auto_connector(host.get_network())
    _defects.patient_negotiation(host.get_network())
    may_fetch = allow
    if admission is not None:
        may_fetch = lambda peer: allow(peer) and admission.allow(peer)  # noqa: E731
    server = BlockServer(
        store,
        allow=may_fetch,
        bucket=TokenBucket(settings.upload_rate_bytes_per_s),
        corrupt_for_tests=settings.corrupt_uploads_for_tests,
        busy_for_tests=settings.busy_for_tests,
    )
    host.set_stream_handler(
        TProtocol(PROTOCOL_ID), _defects.guard_handler(PROTOCOL_ID, server.handle)
    )
    if admission is not None:

        async def handle_admit(raw: INetStream) -> None:
            stream = Libp2pStream(raw, str(raw.muxed_conn.peer_id))
            try:
                if await serve_admit(stream, stream.peer, admission):
                    server.traffic.exchange.admitted(stream.peer)
                await stream.close()
            except StreamBroken:
                await stream.reset()

        host.set_stream_handler(
            TProtocol(ADMIT_PROTOCOL_ID), _defects.guard_handler(ADMIT_PROTOCOL_ID, handle_admit)
        )
    router = _defects.gossipsub_router()
    _defects.back_off_pruned_peers(router)  # defect 18
    _defects.keep_mesh_peers(router)  # defect 25
    pubsub = Pubsub(host, router, strict_signing=True)
    _defects.guard_pubsub_handlers(host, pubsub, router)  # defect 17
    try:
        addrs = [multiaddr.Multiaddr(a) for a in settings.listen]
    except (ValueError, multiaddr.exceptions.Error) as exc:
        raise ListenError(f"bad listen address in {settings.listen}: {exc}") from exc
    _defects.refuse_shared_port(addrs)
    return host, pubsub, router, server, addrs
