"""What the rules read, gathered once and kept: :meth:`FactsCache.facts` and the writes it keeps
up to date, a part of :class:`~._store.Store` (its base class).

A round's facts hold every member's row, and the rules read them on every request and every
transition step, so reading them afresh each time would cost a round of N members O(N) per
request. Instead they are kept across requests (this process is the database's only writer),
and :meth:`apply` re-reads, from the database, exactly the rows each write changed: a member's
row, a round's row, its results, its banned members. A transaction that rolls back after such a
write drops everything kept (the next read starts afresh). See specs/coordinator.md#state.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._wire._protocol import RoundStatus
from ._facts import RoundFacts, RunFacts
from ._rows import BanReportRow, BanRow, CheckpointRow, MemberRow, ResultRow, RoundRow, RunRow
from ._writes import (
    Allow,
    DeleteBan,
    Disallow,
    Log,
    OpenRound,
    PutBan,
    PutBanReport,
    PutCheckpoint,
    PutMember,
    PutPeer,
    PutResult,
    ReplaceResult,
    SetCounter,
    SetMember,
    SetRound,
    SetRun,
    Write,
)

__all__ = ["FactsCache"]

# Rounds kept at most; past it, those the last read did not want are dropped.
_KEPT_ROUNDS = 64

# The members columns a MemberRow is made of (not the score record's bytes: read on their own).
MEMBER_READ = (
    "round, peer, username, status, joined_at, ready_at, header, missing, collected_at, checked, "
    "checked_at, score_record, scored_at"
)


class FactsCache:
    """The facts the rules read, kept and refreshed write by write: the methods :class:`Store`
    inherits (it provides the reads and writes named below)."""

    db: sqlite3.Connection

    def __init__(self) -> None:
        self._rounds: dict[int, RoundFacts] = {}
        self._run: RunRow | None = None
        self._latest: tuple[CheckpointRow | None] | None = None  # None: not read yet
        self._published: list[int] | None = None
        self._changed_in_tx = False

    # -- reads --------------------------------------------------------------------------------

    def facts(self, *rounds: int) -> RunFacts:
        """The rows the rules read: the run, the latest checkpoint, and the current round, the
        next one, every published round and ``rounds`` (see ``_facts.py``)."""
        if self._run is None:
            self._run = self.run_row()
        run = self._run
        if self._published is None:
            self._published = [r.round for r in self.rounds_with_status(RoundStatus.PUBLISHED)]
        wanted = {run.round, run.round + 1, *self._published, *(r for r in rounds if r >= 0)}
        if len(self._rounds) > _KEPT_ROUNDS:
            self._rounds = {n: f for n, f in self._rounds.items() if n in wanted}
        if self._latest is None:
            self._latest = (self.latest_checkpoint(),)
        by_round = {n: self.round_facts(n) for n in sorted(wanted)}
        return RunFacts(run, by_round, self._latest[0])

    def round_facts(self, n: int) -> RoundFacts:
        """Round ``n``'s facts (kept once read)."""
        kept = self._rounds.get(n)
        if kept is None:
            kept = self._read_round(n)
            self._rounds[n] = kept
        return kept

    def _read_round(self, n: int) -> RoundFacts:
        rows = self.db.execute(f"SELECT {MEMBER_READ} FROM members WHERE round = ?", (n,))
        members = {str(r["peer"]): MemberRow.of(r) for r in rows.fetchall()}
        banned = self.db.execute(
            "SELECT peer FROM bans WHERE peer IN (SELECT peer FROM members WHERE round = ?)", (n,)
        ).fetchall()
        public = self.db.execute(
            "SELECT peer FROM peers WHERE peer IN (SELECT peer FROM members WHERE round = ?) "
            "AND addrs IS NOT NULL AND addrs != '[]'",
            (n,),
        ).fetchall()
        return RoundFacts(
            self.round_row(n),
            members,
            self.results(n),
            frozenset(str(b[0]) for b in banned),
            frozenset(str(p[0]) for p in public),
        )

    # -- transactions -------------------------------------------------------------------------

    def tx_begun(self) -> None:
        self._changed_in_tx = False

    def tx_rolled_back(self) -> None:
        """Drop what was kept if this transaction changed any of it (its re-reads saw rows the
        rollback undid)."""
        if self._changed_in_tx:
            self._rounds.clear()
            self._run, self._latest, self._published = None, None, None

    # -- writes -------------------------------------------------------------------------------

    def apply(self, writes: Sequence[Write]) -> None:
        """Apply the rules' writes in order (inside the caller's transaction), re-reading what
        each changed of the kept facts."""
        for w in writes:
            self._write(w)
            if not isinstance(w, Log | SetCounter | PutPeer | PutBanReport | Allow | Disallow):
                self._changed_in_tx = True
                self._refresh(w)

    def _write(self, w: Write) -> None:
        match w:
            case Log(at, actor, kind, detail):
                self.append_log(at, actor, kind, dict(detail))
            case SetRun(values):
                self.set_run(**values)
            case OpenRound(n, epoch, at):
                self.open_round(n, epoch, at)
            case SetRound(n, values):
                self.set_round(n, **values)
            case PutMember(n, peer, username, at):
                self.put_member(n, peer, username, at)
            case SetMember(n, peer, values):
                self.set_member(n, peer, **values)
            case PutPeer(peer, username, at, expires, addrs):
                self.put_peer(peer, username, at, expires, addrs)
            case SetCounter(peer, counter):
                self.set_counter(peer, counter)
            case PutResult(n, partition, peer, header, at):
                self.put_result(n, partition, peer, header, at)
            case ReplaceResult(n, partition, replaced, by):
                self.replace_result(n, partition, replaced, by)
            case PutCheckpoint(row):
                self.put_checkpoint(row)
            case PutBan(row):
                self.put_ban(row)
            case DeleteBan(peer):
                self.delete_ban(peer)
            case PutBanReport(row):
                self.put_ban_report(row)
            case Allow(kind, value, by, at):
                self.allow(kind, value, by, at)
            case Disallow(kind, value):
                self.disallow(kind, value)

    def _refresh(self, w: Write) -> None:
        """Re-read what ``w`` changed of the kept facts (nothing of a round not kept)."""
        match w:
            case SetRun():
                self._run = None
            case OpenRound(n) | SetRound(n):
                self._published = None
                self._replace(n, row=self.round_row(n))
            case PutMember(n, peer) | SetMember(n, peer):
                kept = self._rounds.get(n)
                row = self.member(n, peer)
                if kept is not None and row is not None:
                    banned = kept.banned | ({peer} if self.ban_row(peer) else set())
                    self._replace(n, members={**kept.members, peer: row}, banned=banned)
            case PutResult(n) | ReplaceResult(n):
                self._replace(n, results=self.results(n))
            case PutCheckpoint():
                self._latest = None
            case PutBan(BanRow(peer=peer)):
                for n, kept in list(self._rounds.items()):
                    if peer in kept.members:
                        self._replace(n, banned=kept.banned | {peer})
            case DeleteBan(peer):
                for n, kept in list(self._rounds.items()):
                    self._replace(n, banned=kept.banned - {peer})

    def _replace(self, n: int, **fields: object) -> None:
        kept = self._rounds.get(n)
        if kept is not None:
            self._rounds[n] = dataclasses.replace(kept, **fields)  # type: ignore[arg-type]

    if TYPE_CHECKING:  # what this part uses of Store (defined there and in PeerTables)

        def run_row(self) -> RunRow: ...
        def round_row(self, n: int) -> RoundRow | None: ...
        def rounds_with_status(self, status: RoundStatus) -> list[RoundRow]: ...
        def member(self, n: int, peer: str) -> MemberRow | None: ...
        def results(self, n: int) -> dict[int, ResultRow]: ...
        def ban_row(self, peer: str) -> BanRow | None: ...
        def latest_checkpoint(self) -> CheckpointRow | None: ...
        def append_log(self, now: float, actor: str, kind: str, detail: dict[str, Any]) -> int: ...
        def set_run(self, **values: Any) -> None: ...
        def open_round(self, n: int, epoch: int, now: float) -> None: ...
        def set_round(self, n: int, **values: Any) -> None: ...
        def put_member(self, n: int, peer: str, username: str, now: float) -> None: ...
        def set_member(self, n: int, peer: str, **values: Any) -> None: ...
        def put_peer(
            self, peer: str, username: str, now: float, token_expires: float, addrs: list[str]
        ) -> None: ...
        def set_counter(self, peer: str, counter: int) -> None: ...
        def put_result(
            self, n: int, partition: int, peer: str, header: str, now: float
        ) -> None: ...
        def replace_result(self, n: int, partition: int, replaced: str, by: str) -> None: ...
        def put_checkpoint(self, ckpt: CheckpointRow) -> None: ...
        def put_ban(self, ban: BanRow) -> None: ...
        def delete_ban(self, peer: str) -> bool: ...
        def put_ban_report(self, report: BanReportRow) -> None: ...
        def allow(self, kind: str, value: str, by: str, now: float) -> bool: ...
        def disallow(self, kind: str, value: str) -> bool: ...
