"""Bans: by an admin, on a reputation report the score records confirm, or by a strict
majority of a round's other members reporting the same evidence (specs/coordinator.md#bans); the
partition book bans on its own recomputation. Every ban records its ``BanKind``, every report its
``EvidenceKind``: decisions match on those, never on the words of a reason. Runs inside the
caller's transaction like RunMachine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from cnode.aggregation import EvidenceKind

from .. import limits
from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from .._store._rows import BanReportRow, BanRow, MemberStatus
from .._store._store import Store
from .._wire._ban_records import BanKind, BanReport
from ._verdicts import ReputationVerdict

__all__ = ["BanBook"]

log = structlog.get_logger(__name__)


class BanBook:
    """Bans of one run; ``advance`` is the run machine's (a ban may finish or reopen a round)."""

    def __init__(self, store: Store, advance: Callable[[float], None]) -> None:
        self.store = store
        self.advance = advance

    def ban(
        self,
        peer: str,
        kind: BanKind,
        reason: str,
        by: str,
        now: float,
        *,
        round_: int | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        """Ban ``peer``; ``by`` is the peer id whose request this acts on (see BanKind)."""
        s = self.store
        username = s.peer_username(peer)
        s.put_ban(BanRow(peer, username, kind, reason, round_, evidence or {}, by, now))
        current = s.run_row().round
        for n in (current, current + 1):
            row = s.member(n, peer)
            if row is not None and row.active:
                s.set_member(n, peer, status=MemberStatus.BANNED)
        detail = {"peer": peer, "kind": str(kind), "reason": reason, "round": round_, "by": by}
        s.append_log(now, by, "ban", detail)
        log.info("ban", peer=peer, kind=str(kind), reason=reason, by=by)
        self.advance(now)

    def unban(self, peer: str, by: str, now: float) -> None:
        if not self.store.delete_ban(peer):
            raise RequestRefused(E.NOT_BANNED, f"peer {peer} is not banned")
        self.store.append_log(now, by, "unban", {"peer": peer})

    def parties(self, reporter: str, evidence: dict[str, Any]) -> list[str]:
        """The round's published members, once reporter and accused are two of them (403
        not_member, 409 bad_accused)."""
        n, accused = evidence["round"], evidence["peer"]
        row = self.store.round_row(n)
        published = row.members if row is not None else []
        if reporter not in published:
            raise RequestRefused(E.NOT_MEMBER, f"peer {reporter} was not a member of round {n}")
        if accused not in published or accused == reporter:
            raise RequestRefused(
                E.BAD_ACCUSED, f"peer {accused} is not another member of round {n}"
            )
        return published

    def report(
        self,
        reporter: str,
        evidence: dict[str, Any],
        now: float,
        verdict: ReputationVerdict | None = None,
    ) -> BanReport:
        """Count same-evidence reports of the round's members; ban on a strict majority, or at
        once on a reputation report the score records confirm (``verdict``, computed by the
        caller outside the transaction: specs/coordinator.md#bans step 5).

        Same evidence: the same rejected update of the same round, or outlier reports about the
        same peer within BAN_REPORT_WINDOW rounds (specs/coordinator.md#bans)."""
        s = self.store
        n, accused = evidence["round"], evidence["peer"]
        published = self.parties(reporter, evidence)
        needed = (len(published) - 1) // 2 + 1
        if s.ban_row(accused) is not None:
            return BanReport(accused, n, 0, needed, True)
        checked = _confirmed(verdict, n)
        kind = evidence["kind"]
        s.put_ban_report(
            BanReportRow(
                n, accused, reporter, str(kind), evidence["reason"], evidence["update_cid"],
                evidence["figures"], now,
            )
        )  # fmt: skip
        detail = {"round": n, "peer": accused, "kind": str(kind), "reason": evidence["reason"]}
        s.append_log(now, reporter, "ban_evidence", detail)
        if kind == EvidenceKind.OUTLIER:
            # Members that joined at different rounds reach "k of the last m rounds" at
            # different rounds: outlier reports about the same peer add up over the window.
            first = n - limits.BAN_REPORT_WINDOW + 1
            reporters = s.reporters_in_rounds(accused, str(kind), first, n)
        else:  # the same kind of evidence about the same update of the same round
            reporters = s.reporters_of_update(n, accused, str(kind), evidence["update_cid"])
        decided = BanKind.CHECKED if checked else None
        if decided is None and len(reporters) >= needed:
            decided = BanKind.MAJORITY
        if decided is not None:
            self.ban(
                accused,
                decided,
                evidence["reason"],
                reporter,
                now,
                round_=n,
                evidence={
                    "kind": str(kind),
                    "update_cid": evidence["update_cid"],
                    "reporters": [reporter] if checked else reporters,
                    "others": len(published) - 1,  # the round's other members
                    "figures": evidence["figures"],
                },
            )
        return BanReport(accused, n, len(reporters), needed, decided is not None)


def _confirmed(verdict: ReputationVerdict | None, n: int) -> bool:
    """True: ban on this report alone. Refused (409 evidence_refuted, nothing stored) when the
    records give other figures. False: no verdict, or undecided (the majority rule)."""
    if verdict is None or not verdict.decided:
        return False
    if not verdict.correct:
        raise RequestRefused(
            E.EVIDENCE_REFUTED,
            f"the score records of rounds 1..{n} do not give this evidence: {verdict.reason}",
        )
    return True
