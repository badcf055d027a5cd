"""Admin actions, typed: what ``cnode allowlist``, ``cnode ban`` and ``cnode unban`` ask for.

The request's ``args`` are decoded into one of these by ``_requests.parse_admin`` (400 naming
the field when malformed); ``RunDriver.admin`` (``_http/_driver.py``) applies it inside the
request's transaction, with the rules' ``RunMachine.allowlist_add``, ``BanBook.ban``, ...
See specs/coordinator.md#admin.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "AdminAction",
    "AdminVerb",
    "AllowKind",
    "AllowlistAdd",
    "AllowlistList",
    "AllowlistRemove",
    "BanPeer",
    "LogPage",
    "UnbanPeer",
]


class AdminVerb(StrEnum):
    """An admin request's ``action`` (each decodes into one of the actions below)."""

    ALLOWLIST_ADD = "allowlist.add"
    ALLOWLIST_REMOVE = "allowlist.remove"
    ALLOWLIST_LS = "allowlist.ls"
    BAN = "ban"
    UNBAN = "unban"
    LOG = "log"


class AllowKind(StrEnum):
    """What an allowlist entry names."""

    USER = "user"  # a Hugging Face username (bound to a peer id at join)
    PEER = "peer"  # a peer id
    ORG = "org"  # a Hugging Face org: its members


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
