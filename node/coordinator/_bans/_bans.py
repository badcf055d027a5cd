"""Bans: by an admin, on a reputation report the score records confirm, or by a strict
majority of a round's other members reporting the same evidence (specs/coordinator.md#bans); the
partition book bans on its own recomputation. Every ban records its ``BanKind``, every report its
``EvidenceKind``: decisions match on those, never on the words of a reason.

Pure logic like RunMachine: each method reads facts and returns the writes it decides. A ban may
finish or reopen a round, so the caller advances the run after applying them."""

from __future__ import annotations

from typing import Any

from cnode.aggregation import EvidenceKind

from .. import limits
from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from .._store._facts import RoundFacts, RunFacts, SameEvidence
from .._store._rows import BanReportRow, BanRow, MemberStatus
from .._store._writes import DeleteBan, Log, PutBan, PutBanReport, SetMember, Write
from .._wire._ban_records import BanKind, BanReport
from ._verdicts import ReputationVerdict

__all__ = ["BanBook"]


class BanBook:
    """Bans of one run: decisions over the run's facts, no I/O."""

    def ban(
        self,
        f: RunFacts,
        peer: str,
        username: str,
        kind: BanKind,
        reason: str,
        by: str,
        now: float,
        *,
        round_: int | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> list[Write]:
        """Ban ``peer`` (``username``: its last join's); ``by`` is the peer id whose request
        this acts on (see BanKind)."""
        writes: list[Write] = [
            PutBan(BanRow(peer, username, kind, reason, round_, evidence or {}, by, now))
        ]
        current = f.run.round
        for n in (current, current + 1):
            row = f.round(n).members.get(peer)
            if row is not None and row.active:
                writes.append(SetMember(n, peer, {"status": MemberStatus.BANNED}))
        detail = {"peer": peer, "kind": str(kind), "reason": reason, "round": round_, "by": by}
        writes.append(Log(now, by, "ban", detail, echo=True))
        return writes

    def unban(self, peer: str, banned: bool, by: str, now: float) -> list[Write]:
        if not banned:
            raise RequestRefused(E.NOT_BANNED, f"peer {peer} is not banned")
        return [DeleteBan(peer), Log(now, by, "unban", {"peer": peer})]

    def parties(self, f: RoundFacts, reporter: str, evidence: dict[str, Any]) -> list[str]:
        """The round's published members, once reporter and accused are two of them (403
        not_member, 409 bad_accused)."""
        n, accused = evidence["round"], evidence["peer"]
        published = f.row.members if f.row is not None else []
        if reporter not in published:
            raise RequestRefused(E.NOT_MEMBER, f"peer {reporter} was not a member of round {n}")
        if accused not in published or accused == reporter:
            raise RequestRefused(
                E.BAD_ACCUSED, f"peer {accused} is not another member of round {n}"
            )
        return published

    @staticmethod
    def same_evidence(evidence: dict[str, Any]) -> SameEvidence:
        """The earlier reports a new report of ``evidence`` counts with
        (specs/coordinator.md#bans)."""
        n, kind = int(evidence["round"]), str(evidence["kind"])
        window = kind == EvidenceKind.OUTLIER
        first = n - limits.BAN_REPORT_WINDOW + 1 if window else n
        return SameEvidence(str(evidence["peer"]), kind, first, n, evidence["update_cid"], window)

    def report(
        self,
        f: RunFacts,
        reporter: str,
        evidence: dict[str, Any],
        now: float,
        *,
        earlier: list[str],
        username: str,
        verdict: ReputationVerdict | None = None,
    ) -> tuple[BanReport, list[Write]]:
        """Count same-evidence reports of the round's members; ban on a strict majority, or at
        once on a reputation report the score records confirm (``verdict``, computed by the
        caller outside the transaction: specs/coordinator.md#bans step 5).

        ``earlier``: who reported the same evidence before (the store's answer to
        :meth:`same_evidence`); ``username``: the accused's (for its ban)."""
        n, accused = evidence["round"], evidence["peer"]
        rf = f.round(n)
        published = self.parties(rf, reporter, evidence)
        needed = (len(published) - 1) // 2 + 1
        if accused in rf.banned:
            return BanReport(accused, n, 0, needed, True), []
        checked = _confirmed(verdict, n)
        kind = evidence["kind"]
        writes: list[Write] = [
            PutBanReport(
                BanReportRow(
                    n, accused, reporter, str(kind), evidence["reason"], evidence["update_cid"],
                    evidence["figures"], now,
                )
            )
        ]  # fmt: skip
        detail = {"round": n, "peer": accused, "kind": str(kind), "reason": evidence["reason"]}
        writes.append(Log(now, reporter, "ban_evidence", detail))
        # A reporter's new report replaces its earlier one of the same round: counted once.
        reporters = sorted({*earlier, reporter})
        decided = BanKind.CHECKED if checked else None
        if decided is None and len(reporters) >= needed:
            decided = BanKind.MAJORITY
        if decided is not None:
            writes += self.ban(
                f,
                accused,
                username,
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
        return BanReport(accused, n, len(reporters), needed, decided is not None), writes


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
