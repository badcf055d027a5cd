"""The coordinator's stored rows as typed values: what the store returns and the rules read.

Each row is a frozen dataclass decoded once, here, from its SQLite row: JSON columns become
lists and dicts, status columns become enums, NULL counts stay ``None`` where the rules tell
"not yet" from zero. Nothing above the store sees ``sqlite3.Row`` or a column name in a string.
See specs/coordinator.md#state.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .._wire._ban_records import BanKind
from .._wire._protocol import Phase, RoundStatus

__all__ = [
    "ACTIVE",
    "BanReportRow",
    "BanRow",
    "CheckpointRow",
    "LogEntry",
    "MemberRow",
    "MemberStatus",
    "PeerRow",
    "ResultRow",
    "RoundRow",
    "RunRow",
]


class MemberStatus(StrEnum):
    """A member's standing in one round (the ``members.status`` column)."""

    JOINED = "joined"  # in the round's list, not ready yet
    READY = "ready"  # sent its update header (or said ready)
    LEFT = "left"  # left the round itself
    DROPPED = "dropped"  # not ready by the round deadline
    BANNED = "banned"  # banned while a member


# The statuses that count as taking part in a round (joined or ready).
ACTIVE = (MemberStatus.JOINED, MemberStatus.READY)


def _list(text: str | None) -> list[Any]:
    return list(json.loads(text)) if text else []


@dataclass(frozen=True)
class RunRow:
    """The run's one row: its phase, epoch and current round."""

    phase: Phase
    phase_until: float | None  # when a timed phase (warm-up, cool-down) ends
    epoch: int
    round: int  # the round whose list is open (or closed, waiting for ready members)
    waiting: str | None  # why the run is not moving on (shown in the state, not logged)

    @classmethod
    def of(cls, r: sqlite3.Row) -> RunRow:
        return cls(
            Phase(r["phase"]), r["phase_until"], int(r["epoch"]), int(r["round"]), r["waiting"]
        )


@dataclass(frozen=True)
class RoundRow:
    """One round: its status, times and (once published) its member list and decision."""

    round: int
    epoch: int
    status: RoundStatus
    opened_at: float | None
    closed_at: float | None
    deadline: float | None  # the ready deadline of a closed round
    published_at: float | None
    members: list[str]  # the published list ([] before publishing)
    collect_deadline: float | None
    agreed_at: float | None
    agreed: list[str] | None  # the agreed input set (None before agreement)
    excluded: dict[str, str]  # peer -> why its update is not in the round
    parts: int  # 0: full replication
    backup_steps: int  # backup steps announced so far
    verify_deadline: float | None  # set once every partition has a result
    results_open: float | None  # when the result window opened
    backup_step: float | None  # the window's step
    # partition -> its aggregator, fixed at publish (None: assign_partitions over the members)
    aggregators: list[str] | None = None

    @property
    def listed(self) -> bool:
        """The member list is published (the round is published or agreed)."""
        return self.status in (RoundStatus.PUBLISHED, RoundStatus.AGREED)

    @classmethod
    def of(cls, r: sqlite3.Row) -> RoundRow:
        agreed = r["agreed"]
        return cls(
            int(r["round"]),
            int(r["epoch"]),
            RoundStatus(r["status"]),
            r["opened_at"],
            r["closed_at"],
            r["deadline"],
            r["published_at"],
            _list(r["members"]),
            r["collect_deadline"],
            r["agreed_at"],
            None if agreed is None else _list(agreed),
            dict(json.loads(r["excluded"] or "{}")),
            int(r["parts"] or 0),
            int(r["backup_steps"] or 0),
            r["verify_deadline"],
            r["results_open"],
            r["backup_step"],
            None if r["aggregators"] is None else _list(r["aggregators"]),
        )


@dataclass(frozen=True)
class MemberRow:
    """One peer's membership of one round, and the reports it made there."""

    round: int
    peer: str
    username: str
    status: MemberStatus
    joined_at: float
    ready_at: float | None
    header: str | None  # its update header CID
    missing: list[str] | None  # its `collected` report (None: not reported)
    collected_at: float | None
    checked: list[int] | None  # its `checked` report: the partitions it found wrong
    checked_at: float | None
    score_record: str | None  # the CID of its signed score record
    scored_at: float | None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @classmethod
    def of(cls, r: sqlite3.Row) -> MemberRow:
        missing, checked = r["missing"], r["checked"]
        return cls(
            int(r["round"]),
            str(r["peer"]),
            str(r["username"]),
            MemberStatus(r["status"]),
            float(r["joined_at"]),
            r["ready_at"],
            r["header"],
            None if r["collected_at"] is None else _list(missing),
            r["collected_at"],
            None if r["checked_at"] is None else [int(p) for p in _list(checked)],
            r["checked_at"],
            r["score_record"],
            r["scored_at"],
        )


@dataclass(frozen=True)
class PeerRow:
    """A peer's last join."""

    peer: str
    username: str
    joined_at: float
    token_expires: float | None
    addrs: list[str]


@dataclass(frozen=True)
class BanRow:
    """A ban: who, why, on what evidence (see BanKind for ``by``)."""

    peer: str
    username: str
    kind: BanKind
    reason: str
    round: int | None
    evidence: dict[str, Any]  # {} when none
    by: str
    at: float

    @classmethod
    def of(cls, r: sqlite3.Row) -> BanRow:
        return cls(
            str(r["peer"]),
            str(r["username"]),
            BanKind(r["kind"]),
            str(r["reason"]),
            r["round"],
            dict(json.loads(r["evidence"] or "null") or {}),
            str(r["by"]),
            float(r["at"]),
        )


@dataclass(frozen=True)
class BanReportRow:
    """One member's ban evidence about another (kind: an EvidenceKind's value, or None for a
    report stored before schema 4)."""

    round: int
    accused: str
    reporter: str
    kind: str | None
    reason: str
    update_cid: str | None
    figures: str | None
    at: float


@dataclass(frozen=True)
class ResultRow:
    """A partition's recorded result header (and, once shown wrong, the recomputed output)."""

    round: int
    partition: int
    peer: str
    header: str
    replaced: str | None
    by: str | None
    at: float


@dataclass(frozen=True)
class CheckpointRow:
    round: int
    epoch: int
    manifest: str
    hf_repo: str | None
    hf_revision: str | None
    submitter: str
    at: float

    @classmethod
    def of(cls, r: sqlite3.Row) -> CheckpointRow:
        return cls(
            int(r["round"]),
            int(r["epoch"]),
            str(r["manifest"]),
            r["hf_repo"],
            r["hf_revision"],
            str(r["submitter"]),
            float(r["at"]),
        )


@dataclass(frozen=True)
class LogEntry:
    """One entry of the append-only change log, as an admin reads it."""

    seq: int
    at: float
    actor: str
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at_ms": int(self.at * 1000),
            "actor": self.actor,
            "kind": self.kind,
            "detail": self.detail,
        }
