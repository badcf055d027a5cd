"""The store's reads for the dashboard, and the node reports table (telemetry, not run state).

Reports live in their own table, created on open outside the run schema (they never change the
state version and are never signed back: specs/coordinator.md#reports). Every read is bounded by
its ``limit``.
"""

from __future__ import annotations

import json
from typing import Any

from ._rows import CheckpointRow, MemberRow, PeerRow, RoundRow
from ._store import Store

__all__ = ["Pages"]

_REPORTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    kind TEXT NOT NULL, round INTEGER NOT NULL, peer TEXT NOT NULL, body TEXT NOT NULL,
    at REAL NOT NULL, PRIMARY KEY (kind, round, peer));
"""

# The tables the dashboard counts (names from here only, never from input).
_COUNTED = ("bans", "checkpoints", "peers", "allowlist")


class Pages:
    """Bounded reads of one run's store for the dashboard, and its reports table."""

    def __init__(self, store: Store) -> None:
        self._db = store.db
        self._db.executescript(_REPORTS_SCHEMA)

    # -- dashboard reads --------------------------------------------------------------------------

    def totals(self) -> dict[str, int]:
        """Row counts of the tables the dashboard totals."""
        return {
            table: int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in _COUNTED
        }

    def rounds(self, last: int, limit: int) -> list[RoundRow]:
        """Rounds up to ``last``, newest first."""
        rows = self._db.execute(
            "SELECT * FROM rounds WHERE round <= ? ORDER BY round DESC LIMIT ?", (last, limit)
        ).fetchall()
        return [RoundRow.of(r) for r in rows]

    def members(self, n: int, limit: int) -> tuple[list[MemberRow], int]:
        """Round ``n``'s first ``limit`` members by peer id, and how many it has in all."""
        rows = self._db.execute(
            "SELECT * FROM members WHERE round = ? ORDER BY peer LIMIT ?", (n, limit)
        ).fetchall()
        total = self._db.execute("SELECT COUNT(*) FROM members WHERE round = ?", (n,)).fetchone()
        return [MemberRow.of(r) for r in rows], int(total[0])

    def checkpoints(self, limit: int) -> list[CheckpointRow]:
        """The newest checkpoints, newest first."""
        rows = self._db.execute(
            "SELECT * FROM checkpoints ORDER BY round DESC LIMIT ?", (limit,)
        ).fetchall()
        return [CheckpointRow.of(r) for r in rows]

    def submitters(self, first: int) -> dict[int, str]:
        """Who submitted the checkpoint of each round from ``first`` on."""
        rows = self._db.execute(
            "SELECT round, submitter FROM checkpoints WHERE round >= ?", (first,)
        ).fetchall()
        return {int(r[0]): str(r[1]) for r in rows}

    def peers(self, limit: int) -> list[PeerRow]:
        """The peers that joined last, newest first."""
        rows = self._db.execute(
            "SELECT peer, username, joined_at, token_expires, addrs FROM peers "
            "ORDER BY joined_at DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [PeerRow(r[0], r[1], r[2], r[3], json.loads(r[4] or "[]")) for r in rows]

    # -- node reports -----------------------------------------------------------------------------

    def put_report(self, kind: str, n: int, peer: str, body: dict[str, Any], now: float) -> None:
        """Store one report (replacing the peer's earlier one of the same kind and round)."""
        self._db.execute(
            "INSERT OR REPLACE INTO reports VALUES (?, ?, ?, ?, ?)",
            (kind, n, peer, json.dumps(body, sort_keys=True), now),
        )

    def round_reports(self, first: int, last: int) -> list[tuple[int, str, dict[str, Any]]]:
        """(round, peer, body) of the round reports of rounds first..last, by round then peer."""
        rows = self._db.execute(
            "SELECT round, peer, body FROM reports WHERE kind = 'round' AND round BETWEEN ? AND ? "
            "ORDER BY round, peer",
            (first, last),
        ).fetchall()
        return [(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]

    def holders(self, manifest: str, limit: int) -> list[str]:
        """Peers that reported holding ``manifest`` (after a round or a catch-up)."""
        rows = self._db.execute(
            "SELECT DISTINCT peer FROM reports WHERE json_extract(body, '$.holds') = ? "
            "OR json_extract(body, '$.manifest') = ? ORDER BY peer LIMIT ?",
            (manifest, manifest, limit),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def catch_ups(self, limit: int) -> list[dict[str, Any]]:
        """The newest catch-up reports, newest first."""
        rows = self._db.execute(
            "SELECT peer, body, at FROM reports WHERE kind = 'catch_up' ORDER BY at DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [{"peer": r[0], "at_ms": int(r[2] * 1000), **json.loads(r[1])} for r in rows]
