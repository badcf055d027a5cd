"""The store's tables about peers rather than rounds: who joined, the allowlist, bans and ban
reports, checkpoints. A part of :class:`~._store.Store` (its base class), on the same connection
and inside the same transactions. See specs/coordinator.md#state.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ._facts import SameEvidence
from ._rows import BanReportRow, BanRow, CheckpointRow

__all__ = ["PeerTables"]


class PeerTables:
    """Peers, allowlist, bans, checkpoints: the methods :class:`Store` inherits."""

    db: sqlite3.Connection

    # -- peers and the allowlist ----------------------------------------------------------------

    def put_peer(
        self, peer: str, username: str, now: float, token_expires: float, addrs: list[str]
    ) -> None:
        self.db.execute(
            "INSERT INTO peers (peer, username, joined_at, token_expires, addrs) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT(peer) DO UPDATE SET "
            "username = excluded.username, joined_at = excluded.joined_at, "
            "token_expires = excluded.token_expires, addrs = excluded.addrs",
            (peer, username, now, token_expires, json.dumps(addrs)),
        )

    def peer_addrs(self, peers: list[str]) -> dict[str, list[str]]:
        """The addresses of each of ``peers`` that advertised any (from its last join)."""
        out: dict[str, list[str]] = {}
        for peer in peers:
            row = self.db.execute("SELECT addrs FROM peers WHERE peer = ?", (peer,)).fetchone()
            if row is not None and row[0]:
                addrs = json.loads(row[0])
                if addrs:
                    out[peer] = addrs
        return out

    def peer_username(self, peer: str) -> str:
        row = self.db.execute("SELECT username FROM peers WHERE peer = ?", (peer,)).fetchone()
        return "" if row is None else str(row[0])

    def allowed(self, kind: str, value: str) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM allowlist WHERE kind = ? AND value = ?", (kind, value)
        ).fetchone()
        return row is not None

    def allow(self, kind: str, value: str, by: str, now: float) -> bool:
        cur = self.db.execute(
            "INSERT OR IGNORE INTO allowlist VALUES (?, ?, ?, ?)", (kind, value, by, now)
        )
        return cur.rowcount > 0

    def disallow(self, kind: str, value: str) -> bool:
        cur = self.db.execute("DELETE FROM allowlist WHERE kind = ? AND value = ?", (kind, value))
        return cur.rowcount > 0

    def allowlist(self, limit: int = -1) -> list[dict[str, Any]]:
        """The allowlist's entries (the first ``limit``; all when -1), by kind and value."""
        rows = self.db.execute(
            "SELECT kind, value, added_by, at FROM allowlist ORDER BY kind, value LIMIT ?",
            (limit,),
        ).fetchall()
        return [
            {"kind": r[0], "value": r[1], "added_by": r[2], "at_ms": int(r[3] * 1000)} for r in rows
        ]

    def allowlist_size(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM allowlist").fetchone()[0])

    # -- bans -----------------------------------------------------------------------------------

    def ban_row(self, peer: str) -> BanRow | None:
        row = self.db.execute("SELECT * FROM bans WHERE peer = ?", (peer,)).fetchone()
        return None if row is None else BanRow.of(row)

    def user_ban(self, username: str) -> BanRow | None:
        if not username:
            return None
        row = self.db.execute(
            "SELECT * FROM bans WHERE username = ? ORDER BY at LIMIT 1", (username,)
        ).fetchone()
        return None if row is None else BanRow.of(row)

    def ban_rows(self, limit: int = -1) -> list[BanRow]:
        """Every ban, oldest first (or the newest ``limit``, newest first)."""
        if limit < 0:
            rows = self.db.execute("SELECT * FROM bans ORDER BY at, peer").fetchall()
        else:
            rows = self.db.execute(
                "SELECT * FROM bans ORDER BY at DESC LIMIT ?", (limit,)
            ).fetchall()
        return [BanRow.of(r) for r in rows]

    def put_ban(self, ban: BanRow) -> None:
        """Record ``ban`` (replacing an earlier ban of the same peer)."""
        self.db.execute(
            "INSERT OR REPLACE INTO bans (peer, username, reason, round, evidence, by, at, kind) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (ban.peer, ban.username, ban.reason, ban.round, json.dumps(ban.evidence or None),
             ban.by, ban.at, str(ban.kind)),
        )  # fmt: skip

    def delete_ban(self, peer: str) -> bool:
        return self.db.execute("DELETE FROM bans WHERE peer = ?", (peer,)).rowcount > 0

    def put_ban_report(self, report: BanReportRow) -> None:
        """Record one member's evidence (replacing its earlier report of the same peer and
        round)."""
        self.db.execute(
            "INSERT OR REPLACE INTO ban_reports "
            "(round, accused, reporter, reason, update_cid, figures, at, kind) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (report.round, report.accused, report.reporter, report.reason, report.update_cid,
             report.figures, report.at, report.kind),
        )  # fmt: skip

    def reporters_in_rounds(self, accused: str, kind: str, first: int, last: int) -> list[str]:
        """Who reported ``accused`` with evidence of ``kind`` in rounds first..last."""
        rows = self.db.execute(
            "SELECT DISTINCT reporter FROM ban_reports WHERE accused = ? AND kind = ? "
            "AND round >= ? AND round <= ? ORDER BY reporter",
            (accused, kind, first, last),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def reporters_of_update(
        self, n: int, accused: str, kind: str, update_cid: str | None
    ) -> list[str]:
        """Who reported ``accused``'s update ``update_cid`` of round ``n`` with ``kind``."""
        rows = self.db.execute(
            "SELECT reporter FROM ban_reports WHERE round = ? AND accused = ? AND kind = ? "
            "AND update_cid IS ? ORDER BY reporter",
            (n, accused, kind, update_cid),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def reporters(self, same: SameEvidence) -> list[str]:
        """Who reported the same evidence before (see :class:`SameEvidence`)."""
        if same.window:
            return self.reporters_in_rounds(same.accused, same.kind, same.first, same.last)
        return self.reporters_of_update(same.last, same.accused, same.kind, same.update_cid)

    def ban_reports(self, accused: str, limit: int) -> list[BanReportRow]:
        """The first ``limit`` reports about ``accused``, by round then reporter."""
        rows = self.db.execute(
            "SELECT round, accused, reporter, kind, reason, update_cid, figures, at "
            "FROM ban_reports WHERE accused = ? ORDER BY round, reporter LIMIT ?",
            (accused, limit),
        ).fetchall()
        return [BanReportRow(*r) for r in rows]

    # -- checkpoints --------------------------------------------------------------------------

    def latest_checkpoint(self) -> CheckpointRow | None:
        row = self.db.execute("SELECT * FROM checkpoints ORDER BY round DESC LIMIT 1").fetchone()
        return None if row is None else CheckpointRow.of(row)

    def checkpoint(self, n: int) -> CheckpointRow | None:
        row = self.db.execute("SELECT * FROM checkpoints WHERE round = ?", (n,)).fetchone()
        return None if row is None else CheckpointRow.of(row)

    def checkpoint_rows(self, after: int, limit: int) -> list[CheckpointRow]:
        """Checkpoints of rounds > ``after``, oldest first, at most ``limit``."""
        rows = self.db.execute(
            "SELECT * FROM checkpoints WHERE round > ? ORDER BY round LIMIT ?", (after, limit)
        ).fetchall()
        return [CheckpointRow.of(r) for r in rows]

    def put_checkpoint(self, ckpt: CheckpointRow) -> None:
        self.db.execute(
            "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ckpt.round, ckpt.epoch, ckpt.manifest, ckpt.hf_repo, ckpt.hf_revision,
             ckpt.submitter, ckpt.at),
        )  # fmt: skip
