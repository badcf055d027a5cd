"""Exceptions of cnode.node.p2p.

::

    CnodeError
    └── P2PError                       anything in the libp2p layer of cnode
        ├── ListenError                a listen address is malformed or already in use
        ├── DialError                  a peer could not be reached or refused our handshake
        ├── StreamBroken               the remote side or the network broke a stream mid-way
        ├── PeerProtocolError          a remote peer sent bytes that break specs/blocks.md
        │   ├── FrameTooLargeError     ... a frame or a CID list over the limits
        │   └── BadBlockError          ... a block whose bytes do not hash to its CID
        ├── RemoteRefusedError         a remote peer answered with an ERROR frame (status inside)
        ├── FetchError                 a fetch could not finish: no holder left for some blocks
        ├── AnnouncementError          an announcement we were asked to publish is not valid
        └── RejectedMessage            an incoming pubsub message failed validation (reason inside)

Messages name the peer (short id) and CID involved; they never contain secrets.
"""

from __future__ import annotations

import trio

from cnode.node._exceptions import NodeError


def first_error(
    group: BaseExceptionGroup[BaseException], prefer: type[BaseException] = BaseException
) -> BaseException:
    """What to raise for a nursery whose tasks failed: its first error of type ``prefer``, else
    its first error (tasks working on one request fail for one cause: a holder that corrupts
    every block fails every block being checked at once), or ``group`` itself when it holds only
    cancellations, which the enclosing cancel scope takes."""
    _cancelled, errors = group.split(trio.Cancelled)
    if errors is None:
        return group
    leaves = _leaves(errors)
    return next((e for e in leaves if isinstance(e, prefer)), leaves[0])


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


class P2PError(NodeError):
    """Raised by cnode.node.p2p when a network operation cannot be done."""


class ListenError(P2PError):
    """Raised by open_p2p_node when a listen address is malformed, unusable or already in use."""


class DialError(P2PError):
    """Raised by connect when the peer cannot be reached or its handshake fails."""


class StreamOpenTimeout(DialError):
    """Raised when a holder whose connection is up did not answer a new stream's protocol
    selection, or our access token, in time: busy, not unreachable (the scheduler gives the
    request back and keeps the holder; issue 41)."""


class StreamBroken(P2PError):
    """Raised when the remote side or the network resets or loses a stream (not our misuse)."""


class PeerProtocolError(P2PError):
    """Raised when a remote peer sends a frame that breaks specs/blocks.md (its fault)."""


class FrameTooLargeError(PeerProtocolError):
    """Raised when a remote peer sends a frame or a CID list over the limits of limits.py."""


class BadBlockError(PeerProtocolError):
    """Raised when a remote peer sends bytes that do not hash to the CID they came with."""

    def __init__(self, message: str, *, claimed: str, computed: str) -> None:
        super().__init__(message)
        self.claimed = claimed
        self.computed = computed


class RemoteRefusedError(P2PError):
    """Raised when a remote peer answers a request with an ERROR frame."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NotAdmittedError(DialError):
    """Raised when a holder refuses this node's access token (``/cnode/admit/1.0.0``)."""


class FetchError(P2PError):
    """Raised by fetch when some blocks cannot be had from any holder; progress is kept.

    ``refused_by``: the holders that refused this node outright (ERROR FORBIDDEN, or its access
    token not admitted): in a run, the sign that the coordinator banned it.
    """

    def __init__(
        self, message: str, *, missing: int, fetched: int, refused_by: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(message)
        self.missing = missing
        self.fetched = fetched
        self.refused_by = refused_by


class AnnouncementError(P2PError):
    """Raised by publish/announce when our own message breaks specs/announce.md (our fault)."""


class RejectedMessage(P2PError):
    """Raised by a validator when an incoming message must be dropped; str() is the reason."""
