"""Workarounds for py-libp2p 0.8.1 defects, all in one place (see ../shared DESIGN notes).

Each function names the defect it handles; tests/node/p2p/test_defects.py has one test per defect
that fails without the workaround. Nothing else in cnode touches py-libp2p internals.

1. Inbound slots never released: ``Swarm._do_handle_inbound_connection`` ends in
   ``await self.manager.wait_finished()``, so the task (and its slot of the 250-slot inbound
   ``CapacityLimiter``) lives until the swarm stops; the 251st connection is refused forever.
   :func:`release_inbound_slots` ends that task when its connection closes.
2. Fixed 250 ms per dial: ``dial_peer`` waits ``_HAPPY_EYEBALLS_DELAY`` after *starting* each
   address's dial even when it succeeds at once. :func:`remove_dial_delay` sets it to 0; our
   connect dials one address at a time, so nothing races.
3. A stream handler's exception kills the host: it propagates into the swarm's nursery.
   :func:`guard_handler` wraps every handler we register.
4. The default upgrader offers ``/plaintext/2.0.0`` (and secio, TLS) and mplex:
   :func:`secure_transports` and :func:`muxers` give Noise only and yamux only.
5. Gossipsub: messages over 1 MiB dropped silently, > 32 queued per peer dropped silently, a
   10 msg/s per-topic spam limit that also throttles our own publishes, and a 120 s heartbeat.
   :func:`gossipsub_router` sets the heartbeat and rate; the node bounds message size
   (MAX_ANNOUNCEMENT_SIZE, an error, not a silent drop) and paces publishes (PUBLISH_MAX_PER_S).
   It also queues every message, for 30 s, for each connected peer not (yet) subscribed to its
   topic — meant for the race with the peer's subscription hello, it fills for a peer that never
   subscribes (the coordinator's gossip node, on the update and announce topics), up to 100 per
   peer with a warning at every overflow (about 390 per demo node). The router keeps them
   GOSSIP_PENDING_TTL_S: the race takes milliseconds, and the queue no longer grows.
6. Listeners bind with SO_REUSEPORT, so a second node on the same fixed port starts "fine" and
   the kernel splits inbound connections between the two processes (half the dials then fail
   the Noise handshake). :func:`refuse_shared_port` probes each fixed port first.
7. The TCP listener stays open after ``host.run`` ends (``Swarm.close`` is never called), so
   the port stays taken until the process exits. :func:`close_listeners` closes them.
8. A gossip message that arrives while the host shuts down makes pubsub start a task in its
   closed nursery: ``RuntimeError: Nursery is closed to new arrivals`` at exit, wrapped with
   whatever error really ended the block. :func:`clean_group` drops that noise and unwraps a
   lone real error, so callers (and the CLI) see e.g. a FetchError, not an ExceptionGroup.
9. A dial that fails on every address puts the peer in the swarm's negative cache
   (``Swarm._negative_peer_cache``, a 60 s TTL): for the next minute every dial to that peer
   fails at once ("recently failed all addresses (negative cache)") without trying, even once
   the peer is up again (restarted, or its listener was not ready yet). A node that missed a
   member once could not fetch from it for a minute. :func:`forget_failed_dial` lifts the
   entry (the library's own ``Swarm.unblock_peer``) before each of our dials: callers bound
   and retry dials themselves (``trio.fail_after``), so a real attempt is always wanted.
10. ``host.connect(PeerInfo(peer, [addr]))`` adds ``addr`` to the addresses it already holds
    for the peer (kept 120 s) and dials the old ones first; with defect 2's head start gone,
    the stale address's failure ends the dial, so a peer that came back on another port is
    unreachable for two minutes. :func:`dial_given_address` clears the peer's stored addresses
    before we connect to the address a caller names.
11. ``BasicHost.new_stream`` resets a stream it failed to open (a timeout, or the caller's
    cancel scope) inside a *shielded* cancel scope. On a connection whose writes are wedged —
    the peer vanished without FIN or RST (a cut link, a blackholed route) while a transfer to
    it filled the send buffer — the reset waits for the connection's write lock forever, and
    the shield makes every caller's timeout useless: a round hung on one unreachable member.
    :func:`bound_stream_resets` gives each ``NetStream.reset`` STREAM_RESET_S to send its
    frame; the stream is marked reset and removed either way (the connection's own teardown
    deals with what was not sent).
12. Yamux cuts a stream's writes into DATA frames of ``MAX_MESSAGE_SIZE`` = 65536 bytes, header
    included, but a Noise transport message carries at most 65519 plaintext bytes: every full
    frame goes out as two Noise messages (65519 + 17 bytes), each with its own encryption,
    length prefix, socket write and, on the receiving side, two reads and a decryption. Bulk
    transfers pay every per-message cost twice. :func:`fit_yamux_frames` caps frames at
    YAMUX_MAX_FRAME (one Noise message); any yamux peer accepts smaller frames, so the wire
    stays compatible.
13. The TCP connection under Noise is read with one ``receive_some`` per read call, each sized
    to what the caller asked for: every Noise message costs at least two socket reads (its
    2-byte length, then its body, often in several partial reads), each a trio wait and a
    syscall. :func:`buffer_tcp_reads` reads ahead up to TCP_READ_AHEAD bytes per socket read
    and serves the next reads from that buffer (same results, in order; one reader per
    connection, as Noise has).
14. Yamux's receiver sends a WINDOW_UPDATE for every read call ("release on read", on unless
    ``PY_YAMUX_RELEASE_ON_READ=0``), which bypasses the go-yamux hysteresis it also implements
    (credit returned once half the window is read): a bulk reader sends about one update per
    64 KiB frame, each a Noise message and a socket write, and the sender handles each.
    :func:`batch_window_updates` turns release-on-read off, so updates follow the hysteresis
    (measured: 915 updates for 64 MiB before, 166 after); the window still never closes on a
    reader that keeps reading.
15. Opening a stream, py-libp2p's multistream-select client writes the multistream header,
    waits for the answer, then proposes the protocol and waits again: two round trips before
    the first byte of a request (measured: a request's stream took 50 ms to open over a 20 ms
    link). :func:`pipeline_protocol_select` sends header and proposal together and then reads
    both answers, as go-multistream's ``SelectProtoOrFail`` does: one round trip. Listeners
    read the two messages in order either way; several proposals, or a peer that restarts the
    handshake, fall back to the library's own code.
16. Every swarm runs an auto-connector (go-libp2p's connection-manager dialer) aiming at 200
    connections: while under ``min_connections`` (50) it wakes every 10 s, logs
    ``AUTO_CONNECTOR_STATE`` and ``initiating 200 new dials`` at info (its logger forces INFO on
    itself), and dials up to 32 peers of the peerstore at once: stale addresses, members that
    left, peers the run banned (whom cnode never dials). A cnode node dials whom the
    coordinator lists (train/swarm/_peers.PeerFinder) and nothing else.
    :func:`switch_off_auto_connector` replaces it before the host runs with one that never
    starts: neither its periodic task nor its redial-on-disconnect trigger dials or logs.
17. Pubsub's own stream handler lets a protobuf ``DecodeError`` out (a malformed or cut-short
    frame from any peer), which kills the host as in 3: ``_pubsub_guard.guard_pubsub_handlers``.
"""

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
from libp2p.io.trio import TrioTCPStream
from libp2p.network import swarm as _swarm_module
from libp2p.network.auto_connector import AutoConnector
from libp2p.network.stream.net_stream import NetStream, StreamState
from libp2p.peer.id import ID
from libp2p.protocol_muxer import multiselect_client as _multiselect_client
from libp2p.protocol_muxer.exceptions import MultiselectClientError, MultiselectCommunicatorError
from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIPSUB_V10
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11 as GOSSIPSUB_V11
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux import yamux as _yamux_module
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from . import limits
from ._exceptions import ListenError

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
        # The one catch-all in cnode: any exception escaping here would kill the whole host
        # (defect 3), and py-libp2p raises many unrelated types. It is logged, never swallowed
        # silently, and cancellation (a BaseException) still passes.
        except Exception as exc:
            log.warning("stream_handler_failed", protocol=protocol, error=repr(exc))
            with contextlib.suppress(BaseLibp2pError):
                await stream.reset()

    return guarded


# -- 5. gossipsub defaults -----------------------------------------------------------------------


def gossipsub_router() -> GossipSub:
    """A gossipsub router with a 1 s heartbeat and a per-topic rate that does not throttle us."""
    return GossipSub(
        protocols=[GOSSIPSUB_V11, GOSSIPSUB_V10],
        degree=6,
        degree_low=4,
        degree_high=12,
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


# -- 11. a stream reset on a wedged connection hangs, shielded -------------------------------------


def bound_stream_resets() -> None:
    """Bound ``NetStream.reset``'s frame send to STREAM_RESET_S (idempotent)."""
    if getattr(NetStream.reset, "_cnode_bounded", False):
        return

    async def reset(self: NetStream) -> None:
        # Inside the library's shielded scope this inner deadline still fires.
        with trio.move_on_after(limits.STREAM_RESET_S) as scope:
            with contextlib.suppress(Exception):  # as the original: a failed reset still resets
                await self.muxed_stream.reset()
        if scope.cancelled_caught:
            log.info("stream_reset_not_sent", peer=str(self.muxed_conn.peer_id)[-8:])
        async with self._state_lock:
            self._state = StreamState.RESET
        await self.remove()

    reset._cnode_bounded = True  # type: ignore[attr-defined]
    reset.__wrapped__ = NetStream.reset  # type: ignore[attr-defined]
    NetStream.reset = reset  # type: ignore[method-assign]


# -- 12. yamux frames one byte too big for one Noise message -----------------------------------


def fit_yamux_frames() -> None:
    """Cap yamux DATA frames (header included) at one Noise message (process-wide setting)."""
    _yamux_module.MAX_MESSAGE_SIZE = limits.YAMUX_MAX_FRAME  # type: ignore[attr-defined]


# -- 13. one socket read per read call under Noise ----------------------------------------------


def buffer_tcp_reads() -> None:
    """Read the TCP connection TCP_READ_AHEAD bytes at a time (idempotent, process-wide)."""
    if getattr(TrioTCPStream.read, "_cnode_buffered", False):
        return
    original = TrioTCPStream.read

    async def read(self: TrioTCPStream, n: int | None = None) -> bytes:
        if n == 0:
            return b""
        ahead: bytes = getattr(self, "_cnode_ahead", b"")
        if ahead:
            # Served from what the last socket read brought (no await: nobody reads between).
            take = len(ahead) if n is None else n
            self._cnode_ahead = ahead[take:]  # type: ignore[attr-defined]
            await trio.lowlevel.checkpoint()
            return ahead[:take]
        data = await original(
            self, limits.TCP_READ_AHEAD if n is None else max(n, limits.TCP_READ_AHEAD)
        )
        if n is None or len(data) <= n:
            return data
        self._cnode_ahead = data[n:]  # type: ignore[attr-defined]
        return data[:n]

    read._cnode_buffered = True  # type: ignore[attr-defined]
    read.__wrapped__ = original  # type: ignore[attr-defined]
    TrioTCPStream.read = read  # type: ignore[method-assign]


# -- 14. a yamux window update per read -------------------------------------------------------


_original_release_on_read = _yamux_module._yamux_release_on_read  # type: ignore[attr-defined]


def batch_window_updates() -> None:
    """Return yamux receive credit by go-yamux's half-window hysteresis (process-wide)."""
    _yamux_module._yamux_release_on_read = lambda: False  # type: ignore[attr-defined]


# -- 15. two round trips to select a protocol --------------------------------------------------


def pipeline_protocol_select() -> None:
    """One round trip to open a stream to one protocol (idempotent, process-wide)."""
    client = _multiselect_client.MultiselectClient
    if getattr(client.select_one_of, "_cnode_pipelined", False):
        return
    original = client.select_one_of
    header = _multiselect_client.MULTISELECT_PROTOCOL_ID

    async def select_one_of(
        self: Any,
        protocols: Any,
        communicator: Any,
        negotiate_timeout: int = _multiselect_client.DEFAULT_NEGOTIATE_TIMEOUT,
    ) -> Any:
        if len(protocols) != 1:
            return await original(self, protocols, communicator, negotiate_timeout)
        (protocol,) = protocols
        with trio.move_on_after(negotiate_timeout):
            try:
                await communicator.write(header)
                await communicator.write(str(protocol))
                if await communicator.read() != header:
                    raise MultiselectClientError("invalid handshake")
                answer = await communicator.read()
            except (MultiselectCommunicatorError, MultiselectClientError) as exc:
                raise MultiselectClientError(
                    f"protocol select failed: {exc}, protocol={protocol}"
                ) from exc
            if answer == str(protocol):
                return protocol
            if answer == _multiselect_client.PROTOCOL_NOT_FOUND_MSG:
                raise MultiselectClientError(f"protocols not supported: tried {[str(protocol)]}")
            if answer == header:  # the peer restarted the handshake: the library copes
                return await self.try_select(communicator, protocol)
            raise MultiselectClientError(
                f"unrecognized response: {answer!r}, expected {str(protocol)!r}"
            )
        raise MultiselectClientError(
            f"response timed out after {negotiate_timeout}s, protocols tried: {[str(protocol)]}"
        )

    select_one_of._cnode_pipelined = True  # type: ignore[attr-defined]
    select_one_of.__wrapped__ = original  # type: ignore[attr-defined]
    client.select_one_of = select_one_of  # type: ignore[method-assign]


# -- 16. an auto-connector that dials 200 peers the run does not need -----------------------------


class _StoppedAutoConnector(AutoConnector):
    """An auto-connector that never starts: ``maybe_connect`` and the periodic task return
    at once when not started (the swarm still calls ``start``, ``stop`` and the trigger)."""

    async def start(self) -> None:
        self._started = False


def switch_off_auto_connector(swarm: Any) -> None:
    """Give ``swarm`` (not yet running) an auto-connector that never dials (idempotent)."""
    current = swarm.auto_connector
    if not isinstance(current, _StoppedAutoConnector):
        swarm.auto_connector = _StoppedAutoConnector(
            swarm, auto_connect_interval=current.auto_connect_interval
        )
