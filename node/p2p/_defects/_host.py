"""Workarounds for the host's defects: its transports, dialing, listeners, handlers, pubsub
and teardown (defects 1-10 and 16 of ``cnode.node.p2p._defects``, which lists them all)."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio
from libp2p.abc import IMuxedConn, INetStream
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.exceptions import BaseLibp2pError
from libp2p.network import swarm as _swarm_module
from libp2p.network.auto_connector import AutoConnector
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIPSUB_V10
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11 as GOSSIPSUB_V11
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from .. import limits
from .._exceptions import ListenError

log = structlog.get_logger(__name__)

StreamHandler = Callable[[INetStream], Awaitable[None]]

# -- 4. Noise only, yamux only -------------------------------------------------------------------


def secure_transports(key_pair: KeyPair) -> dict[TProtocol, Any]:
    """Noise as the only security protocol: a plaintext-, TLS- or secio-only dialer is refused."""
    noise = NoiseTransport(key_pair, noise_privkey=new_x25519_key_pair().private_key)
    return {TProtocol(NOISE_PROTOCOL_ID): noise}


def muxers() -> dict[TProtocol, Any]:
    """Yamux as the only stream muxer: an mplex-only dialer is refused."""
    return {TProtocol(YAMUX_PROTOCOL_ID): Yamux}


# -- 2. fixed 250 ms per dial --------------------------------------------------------------------


def remove_dial_delay() -> None:
    """Drop the happy-eyeballs head start that every dial waits out (process-wide setting)."""
    _swarm_module._HAPPY_EYEBALLS_DELAY = 0.0  # type: ignore[attr-defined]


# -- 1. inbound slots never released -------------------------------------------------------------


# Set in each inbound-connection task: the muxed connection its upgrade produced.
class _Upgraded:
    def __init__(self) -> None:
        self.conn: IMuxedConn | None = None
        self.event = trio.Event()


_UPGRADED: contextvars.ContextVar[_Upgraded | None] = contextvars.ContextVar(
    "cnode_upgraded_inbound", default=None
)


def release_inbound_slots(swarm: Any, capacity: int = limits.MAX_INBOUND_CONNECTIONS) -> None:
    """End each inbound-connection task when its connection closes, freeing its slot.

    ``swarm`` is the host's ``Swarm``. Its inbound handler is wrapped: the upgrade records the
    muxed connection in a task-local box; a watcher waits for that connection's ``event_closed``
    and cancels the task, whose ``finally`` then releases the limiter slot. ``capacity`` bounds
    inbound connections open at once.
    """
    original_handle = swarm._do_handle_inbound_connection
    original_upgrade = swarm.upgrade_inbound_raw_conn
    swarm._inbound_limiter = trio.CapacityLimiter(capacity)

    async def upgrade(raw_conn: Any, maddr: Any) -> IMuxedConn:
        muxed: IMuxedConn = await original_upgrade(raw_conn, maddr)
        box = _UPGRADED.get()
        if box is not None:
            box.conn = muxed
            box.event.set()
        return muxed

    async def handle(read_write_closer: Any, maddr: Any, failure_event: Any) -> None:
        box = _Upgraded()
        _UPGRADED.set(box)
        async with trio.open_nursery() as nursery:

            async def run_original() -> None:
                await original_handle(read_write_closer, maddr, failure_event)
                nursery.cancel_scope.cancel()

            nursery.start_soon(run_original)
            await box.event.wait()
            closed = getattr(box.conn, "event_closed", None)
            if closed is None:  # not a muxer we know how to watch: keep the library behaviour
                return
            await closed.wait()
            nursery.cancel_scope.cancel()

    swarm._do_handle_inbound_connection = handle
    swarm.upgrade_inbound_raw_conn = upgrade


# -- 6. SO_REUSEPORT listeners share a port silently ------------------------------------------


def refuse_shared_port(listen: list[Any]) -> None:
    """ListenError if a fixed TCP port in ``listen`` (multiaddrs) is already being listened on.

    The probe socket has SO_REUSEADDR (a port in TIME_WAIT is fine) but not SO_REUSEPORT, so
    its bind fails exactly when another socket listens there.
    """
    for addr in listen:
        protocols = {p.name for p in addr.protocols()}
        if "tcp" not in protocols:
            continue
        port = int(addr.value_for_protocol("tcp"))
        if port == 0:
            continue
        family = socket.AF_INET6 if "ip6" in protocols else socket.AF_INET
        host = addr.value_for_protocol("ip6" if "ip6" in protocols else "ip4")
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ListenError(
                        f"listen address {addr} is already in use (another node on this "
                        "machine? give each its own port: --listen /ip4/0.0.0.0/tcp/PORT, "
                        "or tcp/0 for any free one)"
                    ) from exc
                raise ListenError(f"cannot listen on {addr}: {exc}") from exc


# -- 7. listeners left open after the host stops ----------------------------------------------


async def close_listeners(swarm: Any) -> None:
    """Close every transport listener of ``swarm`` (call after ``host.run`` has exited)."""
    for listener in list(swarm.listeners.values()):
        try:
            await listener.close()
        except (BaseLibp2pError, OSError) as exc:
            log.info("listener_close_failed", error=repr(exc))
    swarm.listeners.clear()


# -- 8. teardown race in pubsub ------------------------------------------------------------------


def is_teardown_race(exc: BaseException) -> bool:
    """True for pubsub's start-a-task-in-a-closed-nursery error during shutdown."""
    return isinstance(exc, RuntimeError) and "closed to new arrivals" in str(exc)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def clean_group(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """What to raise instead of ``group`` leaving a node: None (only teardown races), the lone
    real error if there is exactly one ordinary exception, else the group without the races."""
    _races, rest = group.split(is_teardown_race)
    if rest is None:
        return None
    leaves = _leaves(rest)
    if len(leaves) == 1 and isinstance(leaves[0], Exception):
        return leaves[0]
    return rest


# -- 3. a stream handler's exception kills the host ----------------------------------------------


def guard_handler(protocol: str, handler: StreamHandler) -> StreamHandler:
    """Wrap ``handler`` so nothing it raises reaches the swarm; the stream is reset instead."""

    async def guarded(stream: INetStream) -> None:
        try:
            await handler(stream)
        # A catch-all at a process boundary (py-libp2p's swarm calls our handlers): any
        # exception escaping here would kill the whole host (defect 3), and py-libp2p raises
        # many unrelated types. It is logged, never swallowed silently, and cancellation (a
        # BaseException) still passes.
        except Exception as exc:
            log.warning("stream_handler_failed", protocol=protocol, error=repr(exc))
            with contextlib.suppress(BaseLibp2pError):
                await stream.reset()

    return guarded


# -- 5. gossipsub defaults -----------------------------------------------------------------------


def gossipsub_router() -> GossipSub:
    """A gossipsub router with a 1 s heartbeat, a per-topic rate that does not throttle us, and
    a fixed mesh sized for a run's swarm (specs/announce.md#gossipsub-mesh): the library's
    adaptive bounds, which move D_low, D_high and the heartbeat with a "health" score, are off."""
    return GossipSub(
        protocols=[GOSSIPSUB_V11, GOSSIPSUB_V10],
        degree=limits.GOSSIP_D,
        degree_low=limits.GOSSIP_D_LOW,
        degree_high=limits.GOSSIP_D_HIGH,
        prune_back_off=limits.GOSSIP_PRUNE_BACKOFF_S,
        adaptive_gossip_enabled=False,
        heartbeat_initial_delay=0.1,
        heartbeat_interval=limits.GOSSIP_HEARTBEAT_S,
        max_messages_per_topic_per_second=limits.GOSSIP_MAX_MSGS_PER_TOPIC_PER_S,
        pending_messages_ttl=limits.GOSSIP_PENDING_TTL_S,
    )


def publish_interval() -> float:
    """Seconds between two of our own publishes (pacing under the 32-message peer queue)."""
    return 0.0 if math.isinf(limits.PUBLISH_MAX_PER_S) else 1.0 / limits.PUBLISH_MAX_PER_S


# -- 9. a failed dial blocks every dial to that peer for 60 s -----------------------------------


def forget_failed_dial(swarm: Any, peer_id: ID) -> None:
    """Let the next dial to ``peer_id`` really try, whatever an earlier failed dial cached.

    ``swarm`` is the host's ``Swarm``. Call it right before ``host.connect`` or
    ``host.new_stream`` (which dials when no connection is open).
    """
    swarm.unblock_peer(peer_id)


# -- 10. a peer's old address hides the one we were given -----------------------------------------


def dial_given_address(host: Any, peer_id: ID) -> None:
    """Make the next ``host.connect(PeerInfo(peer_id, [addr]))`` dial ``addr``.

    py-libp2p keeps every address it learned for a peer (120 s) and its dial tries the old ones
    first: a peer that came back on another port is unreachable until they expire. When the
    caller names an address, that is the one to dial: the peer's stored addresses are cleared
    first (connect adds the given one back).
    """
    host.get_peerstore().clear_addrs(peer_id)


# -- 16. an auto-connector that dials 200 peers the run does not need -----------------------------


class _StoppedAutoConnector(AutoConnector):
    """An auto-connector that never starts: ``maybe_connect`` and the periodic task return
    at once when not started (the swarm still calls ``start``, ``stop`` and the trigger)."""

    async def start(self) -> None:
        self._started = False


def patient_negotiation(swarm: Any) -> None:
    """Give a new stream's protocol selection STREAM_NEGOTIATION_TIMEOUT_S, both ways (20)."""
    config = getattr(swarm, "connection_config", None)
    if config is not None:
        config.outbound_stream_protocol_negotiation_timeout = limits.STREAM_NEGOTIATION_TIMEOUT_S
        config.inbound_stream_protocol_negotiation_timeout = limits.STREAM_NEGOTIATION_TIMEOUT_S


def switch_off_auto_connector(swarm: Any) -> None:
    """Give ``swarm`` (not yet running) an auto-connector that never dials (idempotent)."""
    current = swarm.auto_connector
    if not isinstance(current, _StoppedAutoConnector):
        swarm.auto_connector = _StoppedAutoConnector(
            swarm, auto_connect_interval=current.auto_connect_interval
        )
