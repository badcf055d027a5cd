"""Admin actions, typed: what ``cnode allowlist``, ``cnode ban`` and ``cnode unban`` ask for.

The request's ``args`` are decoded into one of these by ``_requests.parse_admin`` (400 naming
the field when malformed); ``RunMachine.admin`` applies it inside the request's transaction.
See specs/coordinator.md#admin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AdminAction",
    "AllowKind",
    "AllowlistAdd",
    "AllowlistList",
    "AllowlistRemove",
    "BanPeer",
    "LogPage",
    "UnbanPeer",
]

AllowKind = Literal["user", "peer", "org"]


@dataclass(frozen=True)
class AllowlistAdd:
    """``allowlist.add``: let a user, peer or org join."""

    kind: AllowKind
    value: str


@dataclass(frozen=True)
class AllowlistRemove:
    """``allowlist.remove``: issued tokens stay valid until they expire; a ban revokes."""

    kind: AllowKind
    value: str


@dataclass(frozen=True)
class AllowlistList:
    """``allowlist.ls``."""


@dataclass(frozen=True)
class BanPeer:
    """``ban``: effective at once, whatever token the peer holds."""

    peer: str
    reason: str


@dataclass(frozen=True)
class UnbanPeer:
    """``unban``."""

    peer: str


@dataclass(frozen=True)
class LogPage:
    """``log``: a page of the change log, entries with sequence > ``after``."""

    after: int
    limit: int


AdminAction = AllowlistAdd | AllowlistRemove | AllowlistList | BanPeer | UnbanPeer | LogPage
