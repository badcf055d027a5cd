"""Whom this node may dial: the peers known to be outbound-only, and the dials that failed.

A peer behind NAT cannot be dialed (issue 37: every round NATed nodes dialed each other's LAN
addresses and waited out a timeout each time). Two things keep a node from dialing what cannot
be dialed (specs/blocks.md#reachability):

- **Outbound-only peers**, as the coordinator's dial-back found them (the training loop marks
  them from the run state): they are reached only over a connection they opened themselves.
- **Failed dials**, remembered for the run: a peer a dial to failed is not dialed again by a
  fetch; it is used again once connected (it dialed us, or the peer finder's own dial to an
  address the coordinator lists succeeded, which clears the memory).

A connected peer is always usable: libp2p opens streams both ways on one connection, so a
holder that dialed us serves its blocks over its own connection.
"""

from __future__ import annotations

import collections

from . import limits

__all__ = ["DialMemory"]


class DialMemory:
    """Peers not to dial: outbound-only ones and those a dial to failed (bounded)."""

    def __init__(self) -> None:
        self.outbound_only: set[str] = set()
        self._failed: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.dials_avoided = 0  # fetches that skipped a peer rather than dial it

    def mark_outbound_only(self, peers: set[str], public: set[str]) -> None:
        """The run's current word: ``peers`` are outbound-only, ``public`` may be dialed."""
        self.outbound_only = (self.outbound_only | peers) - public
        for peer in public:
            self._failed.pop(peer, None)  # listed with a dialable address again: try it

    def failed(self, peer: str, why: str) -> None:
        self._failed[peer] = why
        self._failed.move_to_end(peer)
        while len(self._failed) > limits.MAX_FAILED_DIALS:
            self._failed.popitem(last=False)

    def connected(self, peer: str) -> None:
        """A connection to ``peer`` opened: whatever failed before, it is reachable now."""
        self._failed.pop(peer, None)

    def why_not(self, peer: str) -> str | None:
        """Why ``peer`` must not be dialed, or None if it may be."""
        if peer in self.outbound_only:
            return "outbound-only (the coordinator could not dial it back)"
        why = self._failed.get(peer)
        return None if why is None else f"an earlier dial failed: {why}"
