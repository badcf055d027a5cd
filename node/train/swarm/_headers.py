"""The topic validator that collects the signed update headers of a run (specs/training.md)."""

from __future__ import annotations

from collections.abc import Callable

import trio

from cnode.auth import Opened
from cnode.node.p2p import EnvelopeValidator, RejectedMessage

from .. import limits
from .._exceptions import PeerUpdateError
from .._round import UPDATE_HEADER_TYPE, UpdateHeader, open_update_header

__all__ = ["HeaderCollector"]

# Rounds ahead of the oldest round still wanted for which headers are kept (a joiner that
# catches up can be a round or two behind the swarm).
_HEADER_WINDOW = 4


class HeaderCollector(EnvelopeValidator):
    """Accepts signed update headers of this run and keeps each envelope's bytes.

    The pubsub layer hands subscribers the opened payload only; the checkpoint must name the
    signed bytes by their CID, so the bytes are kept here, keyed by (round, signer).
    """

    def __init__(self, run: str, allow: Callable[[str], bool]) -> None:
        super().__init__(UPDATE_HEADER_TYPE, allow=allow)
        self.run = run
        self.seen: dict[tuple[int, str], tuple[bytes, UpdateHeader]] = {}
        self.lowest = 1  # headers of earlier rounds are refused (see forget_before)
        self.arrived = trio.Event()

    def validate(self, data: bytes, source: str) -> Opened:
        opened = super().validate(data, source)
        try:
            header = open_update_header(data, run=self.run, signer=source)
        except PeerUpdateError as exc:
            raise RejectedMessage(exc.reason) from exc
        # Bounded memory: only rounds near the node's own, at most MAX_ROUND_MEMBERS each.
        if not self.lowest <= header.round <= self.lowest + _HEADER_WINDOW:
            raise RejectedMessage(f"header for round {header.round}, outside the window")
        if (header.round, header.peer) not in self.seen:
            if sum(1 for r, _ in self.seen if r == header.round) >= limits.MAX_ROUND_MEMBERS:
                raise RejectedMessage(f"round {header.round} already has MAX_ROUND_MEMBERS headers")
            self.seen[(header.round, header.peer)] = (data, header)
        self.arrived.set()
        return opened

    def forget_before(self, round_: int) -> None:
        """Drop headers of rounds before ``round_`` and refuse them from now on."""
        self.lowest = max(self.lowest, round_)
        for key in [k for k in self.seen if k[0] < round_]:
            del self.seen[key]
