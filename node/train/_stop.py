"""Why a node stopped: one reason from a closed set, its exit status and its evidence.

Every way ``cnode train`` ends maps to one :class:`StopReason` (specs/training.md#why-a-node-stops):
the node's report writes it in its ``stopped`` line (``stop_reason``, ``exit_code``), and the CLI
prints ``cnode: stopped (<reason>): <evidence>`` and exits with the reason's status. An error
that fits none is ``internal``: a bug, never an expected way to stop (the soak counts it as a
failure).
"""

from __future__ import annotations

import enum

from cnode.auth import AuthError
from cnode.node._exceptions import ConfigError, UsageError
from cnode.node.coordinator import (
    BadRunState,
    CoordinatorRejected,
    CoordinatorUnavailable,
    ErrorCode,
    RunConfigError,
)
from cnode.node.hub import HubLoginError, HubUnavailable
from cnode.node.p2p import P2PError
from cnode.storage import StorageError

from ._exceptions import (
    BannedError,
    CatchUpError,
    MissingUpdatesError,
    NoPublicMemberError,
    OutputsUnavailableError,
    ReplayMismatchError,
    RoundStalledError,
    StateMismatchError,
    TrainingConfigError,
    TrainingError,
    UnreachableError,
)

__all__ = ["NodeStopped", "StopReason", "stop_reason_of"]


class StopReason(enum.StrEnum):
    """The closed set of reasons a node stops; ``exit_code`` is the CLI's exit status. Its value
    is the ``stop_reason`` of the report's ``stopped`` event (decoded back by ``read_report``)."""

    FINISHED = "finished"  # its rounds are done, or it left on SIGTERM/SIGINT
    BANNED = "banned"  # the coordinator's signed state bans it
    UNREACHABLE = "unreachable"  # the peers it needs cannot be reached (named in the evidence)
    COORDINATOR = "coordinator"  # the coordinator is gone, or stalled, past its limit
    CONFIGURATION = "configuration"  # the run's or the node's settings are unusable
    DISK = "disk"  # this node's own files or block store failed
    DIVERGED = "diverged"  # its state differs from the one the swarm agreed on
    INTERNAL = "internal"  # none of the above: a bug (the traceback is in the log)

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]


_EXIT_CODES = {
    StopReason.FINISHED: 0,
    StopReason.INTERNAL: 1,
    StopReason.CONFIGURATION: 3,
    StopReason.BANNED: 4,
    StopReason.UNREACHABLE: 5,
    StopReason.COORDINATOR: 6,
    StopReason.DISK: 7,
    StopReason.DIVERGED: 8,
}


class NodeStopped(TrainingError):
    """Raised by ``run_node`` when a node stops for any reason but ``finished``."""

    def __init__(self, reason: StopReason, evidence: str) -> None:
        super().__init__(evidence)
        self.reason = reason
        self.evidence = evidence


# Most specific first: the first class the error is an instance of decides.
_BY_TYPE: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], StopReason], ...] = (
    (BannedError, StopReason.BANNED),
    (
        (
            UnreachableError,
            NoPublicMemberError,
            CatchUpError,
            MissingUpdatesError,
            OutputsUnavailableError,
            P2PError,
            HubUnavailable,
        ),
        StopReason.UNREACHABLE,
    ),
    ((CoordinatorUnavailable, BadRunState, RoundStalledError), StopReason.COORDINATOR),
    (
        (
            TrainingConfigError,
            ConfigError,
            UsageError,
            RunConfigError,
            AuthError,
            HubLoginError,
            CoordinatorRejected,
        ),
        StopReason.CONFIGURATION,
    ),
    ((StorageError, OSError), StopReason.DISK),
    ((StateMismatchError, ReplayMismatchError), StopReason.DIVERGED),
)


def stop_reason_of(error: BaseException | None) -> StopReason:
    """The reason a node stopped with ``error`` (``None``: it finished)."""
    if error is None:
        return StopReason.FINISHED
    if isinstance(error, NodeStopped):
        return error.reason
    if isinstance(error, CoordinatorRejected) and error.code is ErrorCode.BANNED:
        return StopReason.BANNED
    if isinstance(error, CoordinatorRejected) and error.status >= 500:
        return StopReason.COORDINATOR
    for types, reason in _BY_TYPE:
        if isinstance(error, types):
            return reason
    return StopReason.INTERNAL
