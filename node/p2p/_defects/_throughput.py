"""Workarounds for the defects that slow, hang or break a stream: resets on a wedged connection,
yamux frames and window updates, TCP reads under Noise, protocol selection, and writes cut by a
cancellation (defects 11-15 and 19 of ``cnode.node.p2p._defects``, which lists them all)."""

from __future__ import annotations

import contextlib
from typing import Any

import structlog
import trio
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.io.trio import TrioTCPStream
from libp2p.network.stream.net_stream import NetStream, StreamState
from libp2p.protocol_muxer import multiselect_client as _multiselect_client
from libp2p.protocol_muxer.exceptions import MultiselectClientError, MultiselectCommunicatorError
from libp2p.stream_muxer.yamux import yamux as _yamux_module

from .. import limits

log = structlog.get_logger(__name__)

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


# -- 19. a cancelled frame write breaks the whole connection -------------------------------------


def atomic_frame_writes() -> None:
    """Make each yamux frame's write to the secured connection whole or nothing (idempotent).

    ``Yamux._write_frame`` takes the connection's write lock, then Noise encrypts the frame
    (spending a nonce) and writes it, with checkpoints in between (the TCP stream's own lock,
    ``send_all``). A cancellation delivered there (a request given back, a stolen request, a
    shielded reset's bound) leaves a nonce spent on a message never sent, or half a message on
    the wire: the peer's next decryption fails and it closes the connection, breaking every
    stream on it ("TCP connection reset", "failed to open a stream", a re-admission). The write
    now runs shielded once the lock is held, bounded by CONN_WRITE_BOUND_S; a write that
    cannot finish in that time (a wedged connection) closes the connection, which can carry no
    other frame after a partial one. The caller's cancellation arrives right after the write.
    """
    cls = _yamux_module.Yamux
    if getattr(cls._write_frame, "_cnode_atomic", False):
        return

    async def _write_frame(self: Any, data: bytes) -> None:
        async with self._write_lock:  # waiting for the lock stays cancellable: nothing sent yet
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + limits.CONN_WRITE_BOUND_S
                await self.secured_conn.write(data)
            if scope.cancelled_caught:
                log.warning("connection_write_timed_out", peer=str(self.peer_id)[-8:])
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(limits.STREAM_RESET_S),
                    contextlib.suppress(Exception),
                ):
                    await self.secured_conn.close()
                raise ConnectionClosedError(
                    f"a frame write took over {limits.CONN_WRITE_BOUND_S} s; connection closed",
                    transport="tcp",
                )
        await trio.lowlevel.checkpoint()

    _write_frame._cnode_atomic = True  # type: ignore[attr-defined]
    _write_frame.__wrapped__ = cls._write_frame  # type: ignore[attr-defined]
    cls._write_frame = _write_frame  # type: ignore[method-assign]
