"""Workarounds for py-libp2p 0.8.1 defects, all in one place (see ../shared DESIGN notes).

Each function names the defect it handles; tests/node/p2p/test_defects.py has one test per defect
that fails without the workaround. Nothing else in cnode touches py-libp2p internals. The
workarounds for the host (1-10, 16, 20) are in ``_host.py``; those for a stream's speed and resets
(11-15, 19) in ``_throughput.py``; pubsub's (17, 18, 25) in ``_pubsub.py``; per-RPC and per-read
costs (21-24) in ``_rpc.py`` (tests in test_defects_rpc.py). Callers use this package's names.

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
    frame from any peer), which kills the host as in 3 (found by bench/soak.py: nodes that
    joined while members were killed stopped "internal"). :func:`guard_pubsub_handlers`
    (``_pubsub.py``) registers pubsub's handler again through :func:`guard_handler`.
18. The gossipsub heartbeat prunes an oversubscribed mesh without recording a backoff for the
    pruned peers on its own side (the spec and go-libp2p do), so it may graft one of them
    again a heartbeat later; the peer, which recorded the PRUNE, calls a GRAFT within 10 s a
    flood, penalises us and prunes back: the mesh churns every second at 16 members (426
    "GRAFT flood detected" warnings). :func:`back_off_pruned_peers` (``_pubsub.py``) adds the
    backoff. Its mesh sizes and why are in specs/announce.md#gossipsub-mesh.
19. ``Yamux._write_frame`` lets a cancellation in between Noise's encryption (a nonce spent)
    and the end of the TCP ``send_all``: a frame write cut so leaves the peer unable to decrypt
    the next message, and it closes the connection, every stream on it broken. At 8 members
    every request given back or stolen could cut one (connections reset, re-admissions,
    "failed to open a stream"). :func:`atomic_frame_writes` (``_throughput.py``) shields each
    frame's write once the lock is held, bounded by CONN_WRITE_BOUND_S (then the connection is
    closed: it can carry nothing after half a message).
20. ``ConnectionConfig`` bounds a new stream's protocol selection at 10 s, both ways: one round
    trip through both event loops, which a holder busy on a loaded machine did not make in time
    (384 "failed to open a stream" drops at 16 members, issue 41), though its connection was up
    and it was serving. :func:`patient_negotiation` (``_host.py``) sets
    STREAM_NEGOTIATION_TIMEOUT_S (30 s); a selection that still times out is given back, the
    holder kept (``StreamOpenTimeout``).
21. Every pubsub RPC carries the sender's signed peer record, and the receiver parses it,
    verifies its ed25519 signature and stores it in the peerstore, for every RPC (and again
    for each control message): 7.7% of a 16-member swarm's CPU (issue 41).
    :func:`remember_sender_records` (``_rpc.py``) remembers each peer's last accepted record
    bytes (SENDER_RECORD_PEERS peers) and accepts a repeat without the check, for
    SENDER_RECORD_RECHECK_S and while the peerstore holds the entry that check stored; other
    bytes, or a refused record, get the full check.
22. Yamux answers nearly every read with a WINDOW_UPDATE (its "partial slack" branch, which 14
    does not switch off): pubsub's stream, read a byte at a time, sent one frame per read (6.5%
    of CPU at 16 members). :func:`window_updates_at_half_window` (``_rpc.py``) sends an update
    only once the credit owed reaches half the window, as go-yamux does.
23. Pubsub reads each frame's varint length one byte per ``stream.read`` (three or four reads
    per small RPC). :func:`buffer_pubsub_reads` (``_rpc.py``) reads up to PUBSUB_READ_AHEAD
    bytes at a time and cuts frames from them (same frames, same errors).
24. Every RPC sent rebuilds the host's address list to check our own signed peer record is
    current, then marshals it. :func:`reuse_local_record` (``_rpc.py``) reuses its bytes for
    LOCAL_RECORD_RECHECK_S.
25. The gossipsub heartbeat swaps its worst-scored mesh peer for any better-scored subscriber,
    every heartbeat and topic (``_consider_peer_replacement``, in no spec): with few messages,
    mesh peers' delivery scores sag and a newcomer outscores them, so a swarm larger than
    D_high + 1 swaps mesh peers all along (at 32 members, GRAFTs per node per round 141 -> 112
    and PRUNEs 94 -> 74 without it, issue 41). :func:`keep_mesh_peers` (``_pubsub.py``)
    switches the swap off; the degree bounds still hold the mesh.
"""

from __future__ import annotations

from ._host import StreamHandler as StreamHandler
from ._host import clean_group as clean_group
from ._host import close_listeners as close_listeners
from ._host import dial_given_address as dial_given_address
from ._host import forget_failed_dial as forget_failed_dial
from ._host import gossipsub_router as gossipsub_router
from ._host import guard_handler as guard_handler
from ._host import is_teardown_race as is_teardown_race
from ._host import muxers as muxers
from ._host import patient_negotiation as patient_negotiation
from ._host import publish_interval as publish_interval
from ._host import refuse_shared_port as refuse_shared_port
from ._host import release_inbound_slots as release_inbound_slots
from ._host import remove_dial_delay as remove_dial_delay
from ._host import secure_transports as secure_transports
from ._host import switch_off_auto_connector as switch_off_auto_connector
from ._pubsub import back_off_pruned_peers as back_off_pruned_peers
from ._pubsub import guard_pubsub_handlers as guard_pubsub_handlers
from ._pubsub import keep_mesh_peers as keep_mesh_peers
from ._rpc import buffer_pubsub_reads as buffer_pubsub_reads
from ._rpc import remember_sender_records as remember_sender_records
from ._rpc import reuse_local_record as reuse_local_record
from ._rpc import window_updates_at_half_window as window_updates_at_half_window
from ._throughput import atomic_frame_writes as atomic_frame_writes
from ._throughput import batch_window_updates as batch_window_updates
from ._throughput import bound_stream_resets as bound_stream_resets
from ._throughput import buffer_tcp_reads as buffer_tcp_reads
from ._throughput import fit_yamux_frames as fit_yamux_frames
from ._throughput import pipeline_protocol_select as pipeline_protocol_select

__all__ = [
    "StreamHandler",
    "atomic_frame_writes",
    "back_off_pruned_peers",
    "batch_window_updates",
    "bound_stream_resets",
    "buffer_pubsub_reads",
    "buffer_tcp_reads",
    "clean_group",
    "close_listeners",
    "dial_given_address",
    "fit_yamux_frames",
    "forget_failed_dial",
    "gossipsub_router",
    "guard_handler",
    "guard_pubsub_handlers",
    "is_teardown_race",
    "keep_mesh_peers",
    "muxers",
    "patient_negotiation",
    "pipeline_protocol_select",
    "publish_interval",
    "refuse_shared_port",
    "release_inbound_slots",
    "remember_sender_records",
    "remove_dial_delay",
    "reuse_local_record",
    "secure_transports",
    "switch_off_auto_connector",
    "window_updates_at_half_window",
]
