"""``/cnode/admit/1.0.0``: a peer shows its access token before it may fetch blocks.

See specs/blocks.md#admission. In a run, a node serves blocks only to peers the run's coordinator
admitted: before its first block request to a holder, a requester opens an admit stream and
sends its access token (ADMIT); the holder checks it — signed by the coordinator pinned in the
run config, for this run, not expired, naming the very peer Noise authenticated on this
connection — and answers ADMITTED (with the expiry) or ERROR FORBIDDEN. The holder then serves
that peer until the token expires, unless the peer is banned meanwhile.

:class:`PeerAdmission` is the policy (pure, clock passed in); :func:`serve_admit` and
:func:`present_token` are the two ends of the stream.
"""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Callable, Iterable

import structlog
import trio

from cnode.auth import TokenError, verify_access_token

from .. import limits
from .._exceptions import PeerProtocolError, RemoteRefusedError, StreamBroken
from ._wire import Admit, Admitted, ByteStream, Error, FrameReader, Status

__all__ = ["PeerAdmission", "present_token", "serve_admit"]

log = structlog.get_logger(__name__)


class PeerAdmission:
    """Which peers may fetch from this node, and which token this node shows to others.

    Args:
        coordinator: the run's coordinator peer id (pinned in the run config).
        run: the run id tokens must name.
        credential: ``credential()`` -> this node's current access token (None before joining).
        refused: ``refused(peer)`` -> True for peers refused whatever their token (banned).
        clock: Unix seconds (tests pass a fake).
    """

    def __init__(
        self,
        *,
        coordinator: str,
        run: str,
        credential: Callable[[], bytes | None],
        refused: Callable[[str], bool] = lambda _peer: False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.coordinator = coordinator
        self.run = run
        self.credential = credential
        self.refused = refused
        self.clock = clock
        self._admitted: collections.OrderedDict[str, int] = collections.OrderedDict()
        # holder -> (expiry of the token we showed it, the connection we showed it over): a
        # holder that restarted forgot us, and comes back on another connection.
        self._shown: dict[str, tuple[int, weakref.ref[object]]] = {}
        self._locks: dict[str, trio.Lock] = {}

    def allow(self, peer: str) -> bool:
        """May ``peer`` fetch blocks now? (the block server's allow hook)."""
        expires = self._admitted.get(peer)
        return expires is not None and self.clock() < expires and not self.refused(peer)

    def admit(self, peer: str, token: bytes) -> int:
        """Check ``token`` shown by ``peer``; remember it; return its expiry.

        Raises TokenError (forged, expired, another run or coordinator, malformed) or
        PermissionError (the token is another peer's, or the peer is refused).
        """
        access = verify_access_token(
            token, coordinator_peer_id=self.coordinator, run=self.run, now=self.clock()
        )
        if access.peer_id != peer:
            raise PermissionError(f"the token is {access.peer_id[-8:]}'s, not {peer[-8:]}'s")
        if self.refused(peer):
            raise PermissionError(f"{peer[-8:]} is banned from run {self.run!r}")
        self._admitted[peer] = access.expires_at
        self._admitted.move_to_end(peer)
        while len(self._admitted) > limits.MAX_ADMITTED_PEERS:
            self._admitted.popitem(last=False)
        return access.expires_at

    def to_show(self, holder: str, connections: Iterable[object]) -> bytes | None:
        """The token to show ``holder`` before fetching, or None (shown and still valid).

        ``connections``: the live connections to ``holder`` (the objects ``shown`` was given:
        the muxed connections streams run on); a token shown over none of them (the holder
        restarted, or we reconnected) is shown again. So a token is shown once per connection
        while it is valid, however many requests run over that connection.
        """
        token = self.credential()
        if token is None:
            return None
        expires_at, over = self._shown.get(holder, (0, None))
        live = any(conn is over() for conn in connections) if over is not None else False
        if live and expires_at > self.clock() + limits.ADMIT_RENEW_S:
            return None
        return token

    def shown(self, holder: str, expires_at: int, connection: object) -> None:
        if len(self._shown) >= limits.MAX_ADMITTED_PEERS:
            self._shown = {p: v for p, v in self._shown.items() if v[1]() is not None}
        self._shown[holder] = (expires_at, weakref.ref(connection))

    def lock(self, holder: str) -> trio.Lock:
        """One presentation at a time per holder (two fetch workers start together)."""
        if len(self._locks) > limits.MAX_ADMITTED_PEERS:
            self._locks = {p: lk for p, lk in self._locks.items() if lk.locked()}
        return self._locks.setdefault(holder, trio.Lock())


async def serve_admit(stream: ByteStream, peer: str, admission: PeerAdmission) -> bool:
    """The holder's end: read one ADMIT frame from ``peer``, answer ADMITTED or ERROR; True
    when it admitted the peer."""
    try:
        with trio.fail_after(limits.ADMIT_TIMEOUT_S):
            frame = await FrameReader(stream, read_size=4096).read_frame(limits.MAX_ADMIT_TOKEN)
    except trio.TooSlowError:
        # BUSY, not BAD_REQUEST: the ADMIT is most likely queued on a loaded requester (issue
        # 41: at 16 members this refusal made requesters drop holders as if refused).
        text = f"no ADMIT within ADMIT_TIMEOUT_S ({limits.ADMIT_TIMEOUT_S:g} s)"
        await stream.write(Error(Status.BUSY, text).encode())
        return False
    except PeerProtocolError as exc:
        await stream.write(Error(Status.BAD_REQUEST, f"no valid ADMIT frame: {exc}").encode())
        return False
    if not isinstance(frame, Admit):
        what = "end of stream" if frame is None else type(frame).__name__
        await stream.write(Error(Status.BAD_REQUEST, f"expected ADMIT, got {what}").encode())
        return False
    try:
        expires_at = admission.admit(peer, frame.token)
    except (TokenError, PermissionError) as exc:
        log.warning("admit_refused", requester=peer[-8:], reason=str(exc))
        await stream.write(Error(Status.FORBIDDEN, str(exc)).encode())
        return False
    log.info("admitted", requester=peer[-8:], until=expires_at)
    await stream.write(Admitted(expires_at).encode())
    return True


async def present_token(stream: ByteStream, holder: str, token: bytes) -> int:
    """The requester's end: send ``token``; return the expiry the holder admitted us until.

    Raises RemoteRefusedError (FORBIDDEN: the holder refused the token, its text says why),
    PeerProtocolError, StreamBroken.
    """
    await stream.write(Admit(token).encode())
    with trio.fail_after(limits.ADMIT_TIMEOUT_S):
        frame = await FrameReader(stream, read_size=4096).read_frame(limits.MAX_ERROR_TEXT + 1)
    if isinstance(frame, Admitted):
        return frame.expires_at
    if isinstance(frame, Error):
        raise RemoteRefusedError(
            f"{holder[-8:]} refused our access token: {frame.status.name}: {frame.text}",
            frame.status,
        )
    if frame is None:
        raise StreamBroken(f"{holder[-8:]} closed the admit stream without an answer")
    raise PeerProtocolError(f"{holder[-8:]} answered ADMIT with {type(frame).__name__}")
