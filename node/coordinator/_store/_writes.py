"""Typed writes: what the rules decide, as values the store applies in one transaction.

The rules (``_rounds/``, ``_bans/``) never touch the database: each operation returns a list of
these, and the HTTP layer hands the list to :meth:`Store.apply` inside the request's
transaction. A write names its row by key and the fields it sets by the names of the row's
dataclass fields (``_rows.py``), checked when applied. See specs/coordinator.md#state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._rows import BanReportRow, BanRow, CheckpointRow

__all__ = [
    "Allow",
    "DeleteBan",
    "Disallow",
    "Log",
    "OpenRound",
    "PutBan",
    "PutBanReport",
    "PutCheckpoint",
    "PutMember",
    "PutPeer",
    "PutResult",
    "ReplaceResult",
    "SetCounter",
    "SetMember",
    "SetRound",
    "SetRun",
    "Write",
]


@dataclass(frozen=True)
class Log:
    """Append to the change log (every change is logged; the log's length is the version)."""

    at: float
    actor: str  # the peer whose request this is, "coordinator", or "admin:<peer>"
    kind: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    echo: bool = False  # also written to the process log (transitions and bans)


@dataclass(frozen=True)
class SetRun:
    values: Mapping[str, Any]  # RunRow fields


@dataclass(frozen=True)
class OpenRound:
    round: int
    epoch: int
    at: float


@dataclass(frozen=True)
class SetRound:
    round: int
    values: Mapping[str, Any]  # RoundRow fields


@dataclass(frozen=True)
class PutMember:
    """Enter ``peer`` in ``round`` as joined (again: its reports there are cleared)."""

    round: int
    peer: str
    username: str
    at: float


@dataclass(frozen=True)
class SetMember:
    round: int
    peer: str
    values: Mapping[str, Any]  # MemberRow fields, and score_bytes (the signed record)


@dataclass(frozen=True)
class PutPeer:
    peer: str
    username: str
    at: float
    token_expires: float
    addrs: list[str]


@dataclass(frozen=True)
class SetCounter:
    peer: str
    counter: int


@dataclass(frozen=True)
class PutResult:
    round: int
    partition: int
    peer: str
    header: str
    at: float


@dataclass(frozen=True)
class ReplaceResult:
    round: int
    partition: int
    replaced: str  # the recomputed output
    by: str  # the reporter whose evidence showed it


@dataclass(frozen=True)
class PutCheckpoint:
    row: CheckpointRow


@dataclass(frozen=True)
class PutBan:
    row: BanRow


@dataclass(frozen=True)
class DeleteBan:
    peer: str


@dataclass(frozen=True)
class PutBanReport:
    row: BanReportRow


@dataclass(frozen=True)
class Allow:
    kind: str
    value: str
    by: str
    at: float


@dataclass(frozen=True)
class Disallow:
    kind: str
    value: str


Write = (
    Log | SetRun | OpenRound | SetRound | PutMember | SetMember | PutPeer | SetCounter | PutResult
    | ReplaceResult | PutCheckpoint | PutBan | DeleteBan | PutBanReport | Allow | Disallow
)  # fmt: skip
