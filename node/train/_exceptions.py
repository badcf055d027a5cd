"""Errors raised by the training loop (``cnode.node.train``).

The tree::

    cnode.node.NodeError              (under cnode.CnodeError; node/_exceptions.py)
     └── TrainingError                 anything the training loop reports
          ├── TrainingConfigError      the run's training settings are unusable (its author's fault)
          ├── PeerUpdateError          a peer's update or signed header is invalid (its fault)
          │    └── MalformedUpdateError  its signed update bytes are malformed (ban evidence)
          ├── StateMismatchError       this node's state differs from the one the swarm agreed on
          ├── ReplayMismatchError      recomputing a checkpoint gives other layers than its manifest
          ├── RoundStalledError        the coordinator published no member list in time
          ├── BannedError              the coordinator banned this node (the reason inside)
          ├── CatchUpError             the state needed to join could not be fetched or rebuilt
          ├── UnreachableError         this node reached none of a round's other members
          └── NoPublicMemberError      every member of a round is outbound-only
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cnode.node._exceptions import NodeError

if TYPE_CHECKING:
    from cnode.node.coordinator import BanKind

__all__ = [
    "BannedError",
    "CatchUpError",
    "DeviceError",
    "MalformedUpdateError",
    "MissingUpdatesError",
    "NoPublicMemberError",
    "OutputsUnavailableError",
    "PartitionEvidenceError",
    "PeerUpdateError",
    "ReplayMismatchError",
    "RoundStalledError",
    "StateMismatchError",
    "TrainingConfigError",
    "TrainingError",
    "UnreachableError",
]


class TrainingError(NodeError):
    """Raised by the training loop; the root of the errors below."""


class TrainingConfigError(TrainingError):
    """Raised when a run's training settings (model, data, steps, aggregator) are unusable."""


class DeviceError(TrainingConfigError):
    """Raised when ``--device`` names a device that is unknown or that torch does not see."""


class PeerUpdateError(TrainingError):
    """Raised when a peer's update header or update tensors fail validation.

    The fault is the remote peer's; the round goes on without that update.
    """

    def __init__(self, peer: str, reason: str) -> None:
        super().__init__(f"update from {peer[-8:]} rejected: {reason}")
        self.peer = peer
        self.reason = reason


class MalformedUpdateError(PeerUpdateError):
    """Raised by load_update when a peer's update, held whole, is malformed: another codec than
    the run's, or an encoding that does not decode (wrong length, bad scale, value -128).

    The update manifest CID is named by the peer's signed header, so the bytes prove the fault
    like NaN in an f32 update does: the trainer records it as a rejected update (ban evidence).
    """


class StateMismatchError(TrainingError):
    """Raised when this node's state CID after a round differs from the CID the swarm agreed on.

    Honest nodes must end each round bit-identical; this is never silently repaired.
    """


class ReplayMismatchError(TrainingError):
    """Raised by a replay when the recomputed state differs from a checkpoint's manifest.

    ``layer`` names the first layer (in name order) whose CIDs differ, or is ``None`` when the
    layer sets themselves differ.
    """

    def __init__(self, message: str, layer: str | None = None) -> None:
        super().__init__(message)
        self.layer = layer


class RoundStalledError(TrainingError):
    """Raised when a round's member list does not come within MEMBERS_WAIT_S.

    The message carries the coordinator's own reason (e.g. too few participants).
    """


class MissingUpdatesError(TrainingError):
    """Raised when a node cannot fetch every update of its round's agreed input set."""

    def __init__(self, round_: int, members: list[str], reasons: dict[str, str]) -> None:
        named = ", ".join(f"{m} ({reasons.get(m, '?')})" for m in members)
        super().__init__(
            f"round {round_}: could not fetch the agreed updates of {len(members)} member(s): "
            f"{named}"
        )
        self.round = round_
        self.members = members
        self.reasons = reasons


class CatchUpError(TrainingError):
    """Raised when a joining node cannot fetch or rebuild the state it needs to join a round."""


class BannedError(TrainingError):
    """Raised by the training loop when the run's signed state bans this very node.

    Its peers refuse its block requests and updates from then on; the message carries the
    coordinator's reason (as ``cnode status`` shows it), ``kind`` how the ban was decided.
    """

    def __init__(self, message: str, kind: BanKind) -> None:
        super().__init__(message)
        self.kind = kind


class PartitionEvidenceError(TrainingError):
    """Evidence about a partition result cannot be checked: malformed, incomplete or not the
    named result (the message says which)."""


class OutputsUnavailableError(TrainingError):
    """Raised when a node cannot fetch an agreed partition output: it must not assemble another
    state, so it gives the round up and catches up (specs/training.md#partitioned-rounds)."""


class UnreachableError(TrainingError):
    """Raised when a round exchanged nothing and this node could dial none of its other members:
    it cannot take part. ``peers`` maps each member to why it could not be dialed."""

    def __init__(self, round_: int, peers: dict[str, str]) -> None:
        named = "; ".join(f"{p} ({why})" for p, why in sorted(peers.items()))
        super().__init__(
            f"round {round_}: no partition could be exchanged and this node reached none of the "
            f"round's other members: {named}"
        )
        self.round = round_
        self.peers = peers


class NoPublicMemberError(TrainingError):
    """Raised when every member of a round is outbound-only (none could be dialed back at
    join): no two of them can connect, so the round cannot exchange anything."""

    def __init__(self, round_: int, others: list[str]) -> None:
        super().__init__(
            f"round {round_}: every member is outbound-only (the coordinator could dial none of "
            f"them back), so no member can fetch from another: {', '.join(sorted(others))}. "
            "Fix: run at least one member with a public address: an open or forwarded libp2p "
            "port (--listen, and --announce-addr behind a port mapping), or a machine with a "
            "public IP; on a LAN or one machine, set the run's [network] allow_private_addrs"
        )
        self.round = round_
        self.peers = others
