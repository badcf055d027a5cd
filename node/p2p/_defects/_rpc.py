"""Defects 21-24 of py-libp2p 0.8.1 (the list is in this package's ``__init__``): costs paid per
pubsub RPC or per stream read that a 16-member swarm spent a fifth of its CPU on (issue 41).

Each workaround changes what is computed, never what is accepted or sent: a repeated signed
peer record gets the verdict it got last time; window updates carry the same credit, later
and in fewer frames; the pubsub reader gets the same frames from fewer reads.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from typing import Any

from libp2p.abc import IHost
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.peer import peerstore as _peerstore_module
from libp2p.peer.id import ID
from libp2p.pubsub import floodsub as _floodsub_module
from libp2p.pubsub import gossipsub as _gossipsub_module
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.pubsub import utils as _pubsub_utils
from libp2p.pubsub.pb.rpc_pb2 import RPC
from libp2p.stream_muxer.yamux.yamux import YamuxStream
from libp2p.utils.varint import decode_uvarint

from .. import limits

__all__ = [
    "buffer_pubsub_reads",
    "remember_sender_records",
    "reuse_local_record",
    "window_updates_at_half_window",
]

# The modules that call it by the name they imported (a patch of utils alone changes nothing).
_RECORD_USERS = (_pubsub_utils, _pubsub_module, _gossipsub_module, _floodsub_module)
_LOCAL_RECORD_USERS = (_pubsub_module, _gossipsub_module, _floodsub_module)

# -- 21. the sender's signed peer record verified on every RPC ----------------------------------

# Per host (its peerstore, which the real check writes): sender -> (record bytes, when checked,
# the peerstore entry that check stored).
_accepted: weakref.WeakKeyDictionary[Any, OrderedDict[ID, tuple[bytes, float, Any]]] = (
    weakref.WeakKeyDictionary()
)


def remember_sender_records() -> None:
    """Defect 21: check a peer's signed peer record once, not in every RPC (idempotent).

    py-libp2p attaches the sender's signed peer record (an Envelope, ``senderRecord``) to every
    pubsub RPC, and the receiver (``maybe_consume_signed_record``, called by pubsub for each RPC
    and by gossipsub again for each control message) parses it, verifies its ed25519 signature
    and stores it in the peerstore, every time: 7.7% of a 16-member swarm's CPU. The same bytes
    from the same peer get the same verdict, so the bytes last accepted from each peer are
    remembered (SENDER_RECORD_PEERS peers, least recently seen forgotten first) and a repeat is
    accepted at the cost of a comparison, while the peerstore still holds the entry that check
    stored (the library refuses a record older than the one stored: another record stored
    since, by identify or anyone, means a full check). Different bytes, a refused record, or a
    remembered one older than SENDER_RECORD_RECHECK_S go through the library's check (which
    also keeps the peerstore's entry fresh).
    """
    current = _pubsub_utils.maybe_consume_signed_record
    if getattr(current, "_cnode_remembered", False):
        return
    check = current

    def maybe_consume_signed_record(msg: RPC, host: IHost, peer_id: ID) -> bool:
        if not msg.HasField("senderRecord"):
            return True
        record = msg.senderRecord
        peerstore = host.get_peerstore()
        seen = _accepted.get(peerstore)
        if seen is None:
            seen = _accepted.setdefault(peerstore, OrderedDict())
        stored = getattr(peerstore, "peer_record_map", {})  # peer -> PeerRecordState
        now = time.monotonic()
        last = seen.get(peer_id)
        if (
            last is not None
            and last[0] == record
            and now - last[1] < limits.SENDER_RECORD_RECHECK_S
            and stored.get(peer_id) is last[2]
        ):
            seen.move_to_end(peer_id)
            return True
        if not check(msg, host, peer_id):
            seen.pop(peer_id, None)
            return False
        seen[peer_id] = (record, now, stored.get(peer_id))
        seen.move_to_end(peer_id)
        while len(seen) > limits.SENDER_RECORD_PEERS:
            seen.popitem(last=False)
        return True

    maybe_consume_signed_record._cnode_remembered = True  # type: ignore[attr-defined]
    maybe_consume_signed_record.__wrapped__ = check  # type: ignore[attr-defined]
    for module in _RECORD_USERS:
        module.maybe_consume_signed_record = maybe_consume_signed_record  # type: ignore[attr-defined]


# -- 22. a yamux window update after (almost) every small read -----------------------------------


def window_updates_at_half_window() -> None:
    """Defect 22: send a WINDOW_UPDATE only once half the window is consumed (idempotent).

    ``YamuxStream._auto_tune_and_send_window_update`` runs after every read. Its "partial
    slack" branch sends an update whenever any consumed byte is not yet credited (and credits
    it twice), so pubsub's stream, read one varint byte at a time, answered nearly every read
    with a WINDOW_UPDATE frame: encrypted, written, and handled by the peer (6.5% of CPU at
    16 members). go-yamux (``sendWindowUpdate``) and the yamux spec send an update only when
    the credit owed reaches half the window; that rule is restored, with the library's window
    growth kept. The sender never waits on a window that is not re-opened: a reader blocks only
    on an empty buffer, and then either the credit owed (window minus what the sender still
    holds) reached half the window and was sent, or the sender still holds over half of it.
    """
    current = YamuxStream._auto_tune_and_send_window_update
    if getattr(current, "_cnode_half_window", False):
        return

    async def _auto_tune_and_send_window_update(self: Any, *, bytes_read: int = 0) -> None:
        # No await before the decision: trio runs it whole, as go-yamux does under its lock
        # (recv_window is changed by the frame reader, also without an await in between).
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        owed = self.target_recv_window - (self.recv_window + buffered)
        if owed < self.target_recv_window // 2:
            return
        self.recv_window += owed
        self._pending_recv_release = 0
        owed += self._apply_autotune_epoch(buffered)  # grows the window as the library does
        await self.send_window_update(owed, skip_lock=True)

    _auto_tune_and_send_window_update._cnode_half_window = True  # type: ignore[attr-defined]
    _auto_tune_and_send_window_update.__wrapped__ = current  # type: ignore[attr-defined]
    YamuxStream._auto_tune_and_send_window_update = _auto_tune_and_send_window_update  # type: ignore[method-assign]


# -- 23. pubsub reads its frames' length prefixes one byte per read ------------------------------

_ahead: weakref.WeakKeyDictionary[Any, bytearray] = weakref.WeakKeyDictionary()


async def read_frame_ahead(reader: Any, max_length: int) -> bytes:
    """``read_varint_prefixed_bytes_limited``, reading up to PUBSUB_READ_AHEAD bytes per read.

    What a read brings beyond the frame waits for the next call with the same ``reader``: only
    for a stream that one task reads, frame after frame (pubsub's ``continuously_read_stream``).
    The same errors as the library's for the same input.
    """
    if max_length <= 0:
        raise ValueError("max_length must be greater than 0")
    buf = _ahead.get(reader)
    if buf is None:
        buf = _ahead.setdefault(reader, bytearray())
    while True:
        end = next((i for i in range(min(len(buf), 10)) if not buf[i] & 0x80), -1)
        if end >= 0:
            break
        if len(buf) >= 10:
            raise ParseError("Varint decoding error: integer exceeds maximum size of 64 bits")
        chunk = await reader.read(limits.PUBSUB_READ_AHEAD)
        if not chunk:
            raise IncompleteReadError(
                "Stream ended while reading varint length prefix",
                expected_bytes=1,
                received_bytes=0,
            )
        buf += chunk
    length = decode_uvarint(bytes(buf[: end + 1]))
    if length > max_length:
        raise MessageTooLarge(f"Message length {length} exceeds maximum allowed {max_length}")
    need = end + 1 + length
    while len(buf) < need:
        chunk = await reader.read(max(need - len(buf), limits.PUBSUB_READ_AHEAD))
        if not chunk:
            got = len(buf) - end - 1
            raise IncompleteReadError(
                f"Incomplete message: expected {length}, got {got}",
                expected_bytes=length,
                received_bytes=got,
            )
        buf += chunk
    frame = bytes(buf[end + 1 : need])
    del buf[:need]
    return frame


def buffer_pubsub_reads() -> None:
    """Defect 23: pubsub's frame reader reads ahead (process-wide, idempotent).

    ``Pubsub.continuously_read_stream`` reads each frame with
    ``read_varint_prefixed_bytes_limited``, which reads the varint length one byte per
    ``stream.read`` (each a lock, a yamux buffer slice and a window check) and then the body:
    three or four reads for a small RPC. :func:`read_frame_ahead` reads what the stream has (up
    to PUBSUB_READ_AHEAD) and cuts frames from it. Only pubsub's module name is replaced: the
    reader of each inbound pubsub stream is that one loop.
    """
    _pubsub_module.read_varint_prefixed_bytes_limited = read_frame_ahead  # type: ignore[attr-defined]


# -- 24. our own signed peer record rebuilt for every RPC sent -----------------------------------

_local: weakref.WeakKeyDictionary[Any, tuple[bytes, float]] = weakref.WeakKeyDictionary()


def reuse_local_record() -> None:
    """Defect 24: reuse our signed peer record's bytes for LOCAL_RECORD_RECHECK_S (idempotent).

    ``env_to_send_in_RPC``, called for every RPC gossipsub sends, rebuilds the host's
    advertised address list (``get_addrs``) and compares it with the cached record's, then
    marshals the record again. The bytes are now reused for LOCAL_RECORD_RECHECK_S, after which
    the library's comparison runs again (a new listen address is announced that much later).
    """
    current = _pubsub_module.env_to_send_in_RPC
    if getattr(current, "_cnode_reused", False):
        return
    build = _peerstore_module.env_to_send_in_RPC

    def env_to_send_in_RPC(host: IHost) -> tuple[bytes, bool]:
        now = time.monotonic()
        last = _local.get(host)
        if last is not None and now - last[1] < limits.LOCAL_RECORD_RECHECK_S:
            return last[0], False
        envelope, created = build(host)
        _local[host] = (envelope, now)
        return envelope, created

    env_to_send_in_RPC._cnode_reused = True  # type: ignore[attr-defined]
    env_to_send_in_RPC.__wrapped__ = build  # type: ignore[attr-defined]
    for module in _LOCAL_RECORD_USERS:
        module.env_to_send_in_RPC = env_to_send_in_RPC  # type: ignore[attr-defined]
