"""The wire records of bans: how a ban was decided (``BanKind``), a ban as the signed run state
lists it (``BanRecord``), and the answer to ban evidence (``BanReport``). See
specs/coordinator.md#bans and #messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .._exceptions import BadRunState
from ._fields import optional as _opt
from ._fields import required as _get

__all__ = ["BanKind", "BanRecord", "BanReport"]


class BanKind(StrEnum):
    """How the coordinator decided a ban (specs/coordinator.md#bans); ``BanRecord.by`` names
    whose request it acted on."""

    ADMIN = "admin"  # an admin's `ban` action; by: the admin's peer id
    # A strict majority of the round's other members reported the same evidence; by: the
    # member whose report completed the majority.
    MAJORITY = "majority"
    # A reputation report the coordinator confirmed by replaying the score records it holds; by:
    # the member that reported it.
    CHECKED = "checked"
    # A partition result the coordinator recomputed and found wrong; by: the member that sent
    # the evidence.
    PARTITION = "partition"


@dataclass(frozen=True)
class BanRecord:
    """A banned peer, with the reason shown in ``cnode status``."""

    peer: str  # banned peer id
    username: str  # its HF username ("" if it joined by peer id)
    kind: BanKind  # how the ban was decided: what programs match on
    reason: str  # human-readable reason (for people; nothing matches on its words)
    round: int | None  # the round of the evidence, if any
    by: str  # peer id whose request the ban acted on (see BanKind); "" if not known
    at_ms: int  # when the ban took effect

    def to_payload(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "username": self.username,
            "kind": str(self.kind),
            "reason": self.reason,
            "round": self.round,
            "by": self.by,
            "at_ms": self.at_ms,
        }

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> BanRecord:
        try:
            kind = BanKind(_get(p, "kind", str))
        except ValueError as exc:
            raise BadRunState(f"unknown ban kind {p.get('kind')!r}") from exc
        return cls(
            _get(p, "peer", str),
            _get(p, "username", str),
            kind,
            _get(p, "reason", str),
            _opt(p, "round", int),
            _get(p, "by", str),
            _get(p, "at_ms", int),
        )

    def decided_by(self, names: Mapping[str, str] | None = None) -> str:
        """Who decided the ban, in words: "checked by the coordinator (report of honest-1)".
        ``names`` maps peer ids to names to show (else the id's last 8 characters)."""
        who = (names or {}).get(self.by) or (f"…{self.by[-8:]}" if self.by else "")
        return _describe_ban(self.kind, who)


def _describe_ban(kind: BanKind, who: str) -> str:
    """A ban's decision in words; ``who`` names the peer of ``BanRecord.by`` ("" if unknown)."""
    of = f" ({{}} {who})" if who else ""
    match kind:
        case BanKind.ADMIN:
            return "an admin" + of.format("peer")
        case BanKind.MAJORITY:
            return "a majority of the round's other members" + of.format("last report of")
        case BanKind.CHECKED:
            return "checked by the coordinator" + of.format("report of")
        case BanKind.PARTITION:
            return "the coordinator's recomputation of a partition" + of.format("evidence of")
    raise AssertionError(f"unhandled ban kind {kind!r}")


@dataclass(frozen=True)
class BanReport:
    """The answer to ban evidence: how many members reported the same evidence, and the outcome."""

    accused: str
    round: int
    reports: int  # distinct members of the round who reported this same evidence
    needed: int  # reports needed: a strict majority of the round's other members
    banned: bool  # the accused is banned (now or before)

    def to_json(self) -> dict[str, Any]:
        return {
            "accused": self.accused,
            "round": self.round,
            "reports": self.reports,
            "needed": self.needed,
            "banned": self.banned,
        }

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> BanReport:
        return cls(
            _get(j, "accused", str),
            _get(j, "round", int),
            _get(j, "reports", int),
            _get(j, "needed", int),
            _get(j, "banned", bool),
        )
