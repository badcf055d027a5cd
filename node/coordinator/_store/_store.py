"""The coordinator's durable state: one SQLite file in WAL mode.

Every change runs in one ``BEGIN IMMEDIATE`` transaction that also appends to the change log, and
is committed (``synchronous=FULL``) before the HTTP answer is sent: an acknowledged change survives
a process kill or power loss. A refused request raises inside the transaction, which rolls back,
so it changes nothing. See specs/coordinator.md#state.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any

from .._config import RunConfig
from .._exceptions import RunConfigError
from .._wire._admin import AllowKind
from .._wire._protocol import Phase, RoundStatus
from ._cache import MEMBER_READ, FactsCache
from ._rows import (
    CheckpointRow,
    LogEntry,
    MemberRow,
    MemberStatus,
    ResultRow,
    RoundRow,
    RunRow,
)
from ._schema import SCHEMA_VERSION, create_or_migrate
from ._tables import PeerTables

__all__ = ["SCHEMA_VERSION", "Store"]

# The members columns that record when a member made a phase's report (_pace.py reads them).
_REPORT_TIMES = frozenset({"collected_at", "scored_at", "checked_at"})

# The columns a typed write may set, per table (the field names of its row dataclass that are
# stored as is or as JSON): a write naming another raises before any SQL is built.
_RUN_COLUMNS = frozenset({"phase", "phase_until", "epoch", "round", "waiting"})
_ROUND_COLUMNS = frozenset(
    {
        "epoch", "status", "closed_at", "deadline", "published_at", "members",
        "collect_deadline", "agreed_at", "agreed", "excluded", "parts", "backup_steps",
        "verify_deadline", "results_open", "backup_step", "aggregators",
    }
)  # fmt: skip
_MEMBER_COLUMNS = frozenset(
    {
        "status", "ready_at", "header", "missing", "collected_at", "checked", "checked_at",
        "score_record", "scored_at", "score_bytes",
    }
)  # fmt: skip


def _sql_values(values: dict[str, Any], allowed: frozenset[str], table: str) -> dict[str, Any]:
    """Check a typed write's fields and encode them as stored (lists and dicts as JSON)."""
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"{table} has no writable column {unknown[0]!r}")
    return {
        k: json.dumps(v, sort_keys=isinstance(v, dict))
        if isinstance(v, (list, dict))
        else str(v)
        if isinstance(v, StrEnum)
        else v
        for k, v in values.items()
    }


class Store(PeerTables, FactsCache):
    """SQLite access for one run. Not thread-safe: the server uses it from its event loop only.

    Resource handling: the connection is closed by :meth:`close`.
    Error handling: SQLite errors other than those mapped by callers propagate (they are bugs or a
    broken disk, and must not be acknowledged).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly the
        # block inside `tx()` and nothing is left open between requests.
        self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA busy_timeout=5000")
        create_or_migrate(self.db)
        FactsCache.__init__(self)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[None]:
        """One durable transaction: committed on success, rolled back on any exception."""
        self.db.execute("BEGIN IMMEDIATE")
        self.tx_begun()
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            self.tx_rolled_back()
            raise
        self.db.execute("COMMIT")

    # -- set-up -----------------------------------------------------------------------------

    def initialize(self, config: RunConfig, coordinator: str, now: float) -> RunConfig:
        """Create the run on first start, or check the stored one; return the config in force.

        The stored config wins on restart (the run's rules do not change under its peers); a
        different run id in the file is an error.
        """
        stored = self.meta("config")
        if stored is not None:
            stored_config = RunConfig.from_dict(json.loads(stored))
            if stored_config.run != config.run:
                raise RunConfigError(
                    f"{self.path} holds run {stored_config.run!r}, the run config says "
                    f"{config.run!r}; use another --db"
                )
            if self.meta("coordinator") != coordinator:
                raise RunConfigError(f"{self.path} belongs to another coordinator key")
            return stored_config
        with self.tx():
            self.db.execute(
                "INSERT INTO meta VALUES ('schema', ?), ('config', ?), ('coordinator', ?)",
                (str(SCHEMA_VERSION), json.dumps(config.to_dict(), sort_keys=True), coordinator),
            )
            self.db.execute(
                "INSERT INTO run VALUES (1, ?, NULL, 0, 1, NULL)",
                (str(Phase.WAITING_FOR_MEMBERS),),
            )
            self.open_round(1, 0, now)
            access = config.access
            for kind, values in ((AllowKind.USER, access.users), (AllowKind.PEER, access.peers)):
                for value in values:
                    self.allow(kind, value, "config", now)
            for org in access.orgs:
                self.allow(AllowKind.ORG, org, "config", now)
            if config.initial_checkpoint:
                self.put_checkpoint(
                    CheckpointRow(0, 0, config.initial_checkpoint, None, None, coordinator, now)
                )
            self.append_log(now, "coordinator", "run_created", {"run": config.run})
        return config

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    # -- change log -------------------------------------------------------------------------

    def append_log(self, now: float, actor: str, kind: str, detail: dict[str, Any]) -> int:
        cur = self.db.execute(
            "INSERT INTO log (at, actor, kind, detail) VALUES (?, ?, ?, ?)",
            (now, actor, kind, json.dumps(detail, sort_keys=True)),
        )
        return int(cur.lastrowid or 0)

    def version(self) -> int:
        row = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM log").fetchone()
        return int(row[0])

    def log_page(self, after: int, limit: int) -> list[LogEntry]:
        rows = self.db.execute(
            "SELECT seq, at, actor, kind, detail FROM log WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()
        return [
            LogEntry(int(r["seq"]), float(r["at"]), r["actor"], r["kind"], json.loads(r["detail"]))
            for r in rows
        ]

    # -- replay protection ------------------------------------------------------------------

    def last_counter(self, peer: str) -> int | None:
        row = self.db.execute("SELECT last FROM counters WHERE peer = ?", (peer,)).fetchone()
        return None if row is None else int(row[0])

    def set_counter(self, peer: str, counter: int) -> None:
        self.db.execute(
            "INSERT INTO counters VALUES (?, ?) "
            "ON CONFLICT(peer) DO UPDATE SET last = excluded.last",
            (peer, counter),
        )

    # -- run row ----------------------------------------------------------------------------

    def run_row(self) -> RunRow:
        row = self.db.execute("SELECT * FROM run WHERE id = 1").fetchone()
        assert row is not None, "initialize() creates the run row"
        return RunRow.of(row)

    def set_run(self, **values: Any) -> None:
        """Set fields of the run row (names of :class:`RunRow` fields)."""
        values = _sql_values(values, _RUN_COLUMNS, "run")
        cols = ", ".join(f"{k} = ?" for k in values)
        self.db.execute(f"UPDATE run SET {cols} WHERE id = 1", tuple(values.values()))

    # -- rounds and members -----------------------------------------------------------------

    def round_row(self, n: int) -> RoundRow | None:
        row = self.db.execute("SELECT * FROM rounds WHERE round = ?", (n,)).fetchone()
        return None if row is None else RoundRow.of(row)

    def current_round_row(self) -> RoundRow:
        row = self.round_row(self.run_row().round)
        assert row is not None, "the current round always has a row"
        return row

    def open_round(self, n: int, epoch: int, now: float) -> None:
        """Add round ``n``, open to joiners."""
        self.db.execute(
            "INSERT INTO rounds (round, epoch, status, opened_at) VALUES (?, ?, ?, ?)",
            (n, epoch, str(RoundStatus.OPEN), now),
        )

    def set_round(self, n: int, **values: Any) -> None:
        """Set fields of round ``n`` (names of :class:`RoundRow` fields)."""
        values = _sql_values(values, _ROUND_COLUMNS, "rounds")
        cols = ", ".join(f"{k} = ?" for k in values)
        self.db.execute(f"UPDATE rounds SET {cols} WHERE round = ?", (*values.values(), n))

    def rounds_with_status(self, status: RoundStatus) -> list[RoundRow]:
        rows = self.db.execute(
            "SELECT * FROM rounds WHERE status = ? ORDER BY round", (str(status),)
        ).fetchall()
        return [RoundRow.of(r) for r in rows]

    def member(self, n: int, peer: str) -> MemberRow | None:
        row = self.db.execute(
            f"SELECT {MEMBER_READ} FROM members WHERE round = ? AND peer = ?", (n, peer)
        ).fetchone()
        return None if row is None else MemberRow.of(row)

    def members(self, n: int, *statuses: MemberStatus) -> list[str]:
        marks = ", ".join("?" for _ in statuses)
        rows = self.db.execute(
            f"SELECT peer FROM members WHERE round = ? AND status IN ({marks}) ORDER BY peer",
            (n, *map(str, statuses)),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def count_members(self, n: int, *statuses: MemberStatus) -> int:
        marks = ", ".join("?" for _ in statuses)
        row = self.db.execute(
            f"SELECT COUNT(*) FROM members WHERE round = ? AND status IN ({marks})",
            (n, *map(str, statuses)),
        ).fetchone()
        return int(row[0])

    def put_member(self, n: int, peer: str, username: str, now: float) -> None:
        """Enter ``peer`` in round ``n`` as joined (again: its reports there are cleared)."""
        self.db.execute(
            "INSERT INTO members (round, peer, username, status, joined_at) "
            "VALUES (?, ?, ?, 'joined', ?) "
            "ON CONFLICT(round, peer) DO UPDATE SET status = 'joined', "
            "joined_at = excluded.joined_at, ready_at = NULL, header = NULL, "
            "missing = NULL, collected_at = NULL, checked = NULL, checked_at = NULL",
            (n, peer, username, now),
        )

    def set_member(self, n: int, peer: str, **values: Any) -> None:
        """Set fields of ``peer``'s membership of round ``n`` (names of :class:`MemberRow`
        fields, and ``score_bytes``: the signed score record itself)."""
        values = _sql_values(values, _MEMBER_COLUMNS, "members")
        cols = ", ".join(f"{k} = ?" for k in values)
        self.db.execute(
            f"UPDATE members SET {cols} WHERE round = ? AND peer = ?", (*values.values(), n, peer)
        )

    def headers(self, n: int) -> dict[str, str]:
        """Round ``n``'s ready members' update headers."""
        rows = self.db.execute(
            "SELECT peer, header FROM members WHERE round = ? AND status = 'ready' "
            "AND header IS NOT NULL ORDER BY peer",
            (n,),
        ).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}

    def listed_headers(self, n: int, members: list[str]) -> dict[str, str]:
        """The headers of ``members`` in round ``n``, whatever their status since (a banned
        member's stays)."""
        rows = self.db.execute(
            "SELECT peer, header FROM members WHERE round = ? AND header IS NOT NULL ORDER BY peer",
            (n,),
        ).fetchall()
        listed = set(members)
        return {str(r[0]): str(r[1]) for r in rows if r[0] in listed}

    def collected(self, n: int) -> dict[str, list[str]]:
        """Round ``n``'s `collected` reports: member -> the members whose update it lacks."""
        rows = self.db.execute(
            "SELECT peer, missing FROM members WHERE round = ? AND collected_at IS NOT NULL",
            (n,),
        ).fetchall()
        return {str(r[0]): json.loads(r[1] or "[]") for r in rows}

    def checked(self, n: int) -> dict[str, list[int]]:
        """Round ``n``'s `checked` reports: member -> the partitions it found wrong."""
        rows = self.db.execute(
            "SELECT peer, checked FROM members WHERE round = ? AND checked_at IS NOT NULL",
            (n,),
        ).fetchall()
        return {str(r[0]): json.loads(r[1] or "[]") for r in rows}

    def report_times(self, n: int, column: str, members: list[str]) -> list[float]:
        """When each of ``members`` made round ``n``'s report of a phase: ``column`` is one of
        ``collected_at``, ``scored_at``, ``checked_at`` (those that reported only)."""
        if column not in _REPORT_TIMES:
            raise ValueError(f"{column!r} is not a report time column")
        rows = self.db.execute(
            f"SELECT peer, {column} FROM members WHERE round = ? AND {column} IS NOT NULL", (n,)
        ).fetchall()
        listed = set(members)
        return [float(r[1]) for r in rows if r[0] in listed]

    def score_records(self, n: int) -> dict[str, str]:
        """Round ``n``'s recorded score records: member -> record CID."""
        rows = self.db.execute(
            "SELECT peer, score_record FROM members WHERE round = ? AND score_record IS NOT NULL"
            " ORDER BY peer",
            (n,),
        ).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}

    def score_bytes(self, n: int) -> dict[str, bytes]:
        """Round ``n``'s score records: member -> the signed envelope's bytes."""
        rows = self.db.execute(
            "SELECT peer, score_bytes FROM members WHERE round = ? AND score_bytes IS NOT NULL"
            " ORDER BY peer",
            (n,),
        ).fetchall()
        return {str(r[0]): bytes(r[1]) for r in rows}

    # -- partition results --------------------------------------------------------------------

    def results(self, n: int) -> dict[int, ResultRow]:
        """Round ``n``'s recorded partition results: partition -> row."""
        rows = self.db.execute(
            "SELECT round, partition, peer, header, replaced, by, at FROM results "
            "WHERE round = ? ORDER BY partition",
            (n,),
        ).fetchall()
        return {int(r[1]): ResultRow(*r) for r in rows}

    def put_result(self, n: int, partition: int, peer: str, header: str, now: float) -> None:
        self.db.execute(
            "INSERT INTO results (round, partition, peer, header, at) VALUES (?, ?, ?, ?, ?)",
            (n, partition, peer, header, now),
        )

    def replace_result(self, n: int, partition: int, replaced: str, by: str) -> None:
        self.db.execute(
            "UPDATE results SET replaced = ?, by = ? WHERE round = ? AND partition = ?",
            (replaced, by, n, partition),
        )
