"""What a fetch takes and gives: its stream, direct holders, progress and report.

The types the scheduler (``_scheduler.Transfer``) works with, apart from its policy, so that
the node, the gateway client and the traffic counters can name them without the policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from cnode.storage import CID, VerifiedBlock

from .._blocks._wire import ByteStream

__all__ = [
    "DirectHolder",
    "FetchProgress",
    "FetchReport",
    "OnBlock",
    "OpenStream",
    "RequestStream",
    "Reveal",
]


class RequestStream(ByteStream, Protocol):
    """What the scheduler needs of a stream: the ByteStream methods, ``reset`` and, for the
    node's pool of idle streams (``_pool``), ``connection_closed``."""

    async def reset(self) -> None:
        """Abort the stream (the holder stops sending); never raises."""
        ...

    def connection_closed(self) -> bool:
        """Has its connection closed? (An idle pooled stream is then of no use.)"""
        ...


OpenStream = Callable[[str], Awaitable[RequestStream]]
OnBlock = Callable[[VerifiedBlock], Awaitable[None]]
# reveal(block) -> (nodes, leaves): what a stored block newly shows to be missing (a manifest
# node's children, storage.ClosureWalk.arrived). Called in the storing thread.
Reveal = Callable[[VerifiedBlock], tuple[list[CID], list[CID]]]


class DirectHolder(Protocol):
    """A holder reached without a libp2p stream (a trustless HTTP gateway, specs/gateway.md).

    It answers one request like ``request_blocks`` does: blocks in request order, each
    verified against its CID before ``on_block``; ``on_block_start(cid)`` once a block's
    bytes begin to arrive; ``on_frame(n)`` on any progress, with the ``n`` bytes received
    since the last call (0 for headers: the minimum rate counts them); returns the CIDs it
    lacks; raises the same errors (BadBlockError, PeerProtocolError, RemoteRefusedError,
    StreamBroken, DialError).
    """

    name: str

    async def request(
        self,
        cids: list[CID],
        on_block: OnBlock,
        on_frame: Callable[[int], None],
        on_block_start: Callable[[CID], None],
    ) -> set[CID]: ...


@dataclass(frozen=True)
class FetchProgress:
    """A snapshot handed to the progress callback after every stored block."""

    bytes: int  # block bytes stored by this fetch so far
    blocks: int  # blocks stored by this fetch so far
    pending: int  # CIDs known to be missing and not yet stored
    holders_in_use: int  # holders with a request in flight now
    elapsed_s: float


@dataclass(frozen=True)
class FetchReport:
    """What one fetch did. ``per_holder_bytes`` counts verified block bytes by peer id."""

    root: CID
    blocks: int
    bytes: int
    seconds: float
    per_holder_bytes: dict[str, int]
    dropped: dict[str, str]  # holder -> why it was dropped (bad bytes, timeout, ...)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0
