"""The coordinator database's schema, and the migration of a database an older version made.

A new database gets every table; one of an older schema gains the columns added since (empty)
and, from schema 4, the kind of each ban (schema 5: each partitioned round's result window).
See specs/coordinator.md#state.
"""

from __future__ import annotations

import sqlite3

from .._wire._ban_records import BanKind

__all__ = ["SCHEMA_VERSION", "create_or_migrate"]

SCHEMA_VERSION = 5

# Columns added since schema 1 (a database of an older version gains them on open, empty):
# peer addresses (discovery) and the per-round input-set decision (schema 2); partitioned rounds:
# the partition count, the backup steps announced, the verify deadline and each member's
# `checked` report (schema 3; the `results` table is created when missing); the kind of each ban
# and of each ban report (schema 4: `_kind_old_bans` fills it in for bans made before). See
# specs/coordinator.md#state.
_ADDED_COLUMNS = (
    ("peers", "addrs", "TEXT"),
    ("members", "missing", "TEXT"),
    ("members", "collected_at", "REAL"),
    ("rounds", "collect_deadline", "REAL"),
    ("rounds", "agreed_at", "REAL"),
    ("rounds", "agreed", "TEXT"),
    ("rounds", "excluded", "TEXT"),
    ("rounds", "parts", "INTEGER"),
    ("rounds", "backup_steps", "INTEGER"),
    ("rounds", "verify_deadline", "REAL"),
    ("members", "checked", "TEXT"),
    ("members", "checked_at", "REAL"),
    # Scores in partitioned rounds (issue 12): each member's score record CID and when it came.
    ("members", "score_record", "TEXT"),
    ("members", "scored_at", "REAL"),
    ("members", "score_bytes", "BLOB"),
    # Ban kinds (issue 28): a BanKind per ban, an EvidenceKind per ban report.
    ("bans", "kind", "TEXT"),
    ("ban_reports", "kind", "TEXT"),
    # Deadlines that follow the swarm (issue 23, schema 5): when a partitioned round's result
    # window opened and the backup step it was given (specs/coordinator.md#pace).
    ("rounds", "results_open", "REAL"),
    ("rounds", "backup_step", "REAL"),
    # Peers behind NAT (issue 37): who aggregates each partition, fixed at publish from the
    # members' reachability (NULL: the assignment over every member, as before).
    ("rounds", "aggregators", "TEXT"),
)

# Schema 3 wrote a ban's kind into its `by` as a prefix; schema 4 keeps the kind apart and `by`
# as the bare peer id (a majority ban named no peer: "majority:<n> of <m>").
_OLD_BY_PREFIX = {
    "admin": BanKind.ADMIN,
    "majority": BanKind.MAJORITY,
    "checked": BanKind.CHECKED,
    "evidence": BanKind.PARTITION,
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    phase TEXT NOT NULL, phase_until REAL, epoch INTEGER NOT NULL, round INTEGER NOT NULL,
    waiting TEXT);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, status TEXT NOT NULL,
    opened_at REAL, closed_at REAL, deadline REAL, published_at REAL, members TEXT);
CREATE TABLE IF NOT EXISTS members (
    round INTEGER NOT NULL, peer TEXT NOT NULL, username TEXT NOT NULL, status TEXT NOT NULL,
    joined_at REAL NOT NULL, ready_at REAL, header TEXT, PRIMARY KEY (round, peer));
CREATE TABLE IF NOT EXISTS peers (
    peer TEXT PRIMARY KEY, username TEXT NOT NULL, joined_at REAL NOT NULL, token_expires REAL);
CREATE TABLE IF NOT EXISTS checkpoints (
    round INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, manifest TEXT NOT NULL, hf_repo TEXT,
    hf_revision TEXT, submitter TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS allowlist (
    kind TEXT NOT NULL, value TEXT NOT NULL, added_by TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (kind, value));
CREATE TABLE IF NOT EXISTS bans (
    peer TEXT PRIMARY KEY, username TEXT NOT NULL, reason TEXT NOT NULL, round INTEGER,
    evidence TEXT, by TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS ban_reports (
    round INTEGER NOT NULL, accused TEXT NOT NULL, reporter TEXT NOT NULL, reason TEXT NOT NULL,
    update_cid TEXT, figures TEXT, at REAL NOT NULL, PRIMARY KEY (round, accused, reporter));
CREATE TABLE IF NOT EXISTS results (
    round INTEGER NOT NULL, partition INTEGER NOT NULL, peer TEXT NOT NULL, header TEXT NOT NULL,
    replaced TEXT, by TEXT, at REAL NOT NULL, PRIMARY KEY (round, partition));
CREATE TABLE IF NOT EXISTS counters (peer TEXT PRIMARY KEY, last INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, actor TEXT NOT NULL,
    kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS log_no_update BEFORE UPDATE ON log
    BEGIN SELECT RAISE(ABORT, 'the change log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS log_no_delete BEFORE DELETE ON log
    BEGIN SELECT RAISE(ABORT, 'the change log is append-only'); END;
"""


def create_or_migrate(db: sqlite3.Connection) -> None:
    """Create the tables a new database lacks, add the columns an old one lacks, fill in what
    the new columns need, and record the schema version (if the run exists already)."""
    db.executescript(_SCHEMA)
    for table, column, kind in _ADDED_COLUMNS:
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    _kind_old_bans(db)
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if row is not None and row[0] != str(SCHEMA_VERSION):
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))


def _kind_old_bans(db: sqlite3.Connection) -> None:
    """Bans stored before schema 4 get their kind from the old `by` prefix (an unknown prefix
    stays an admin's: only an admin's request wrote anything else). Ban reports stored before
    carry no kind and count toward no new decision (specs/coordinator.md#state)."""
    rows = db.execute("SELECT peer, by FROM bans WHERE kind IS NULL").fetchall()
    for peer, by in rows:
        prefix, _, rest = str(by).partition(":")
        kind = _OLD_BY_PREFIX.get(prefix, BanKind.ADMIN)
        who = "" if kind is BanKind.MAJORITY else rest if prefix in _OLD_BY_PREFIX else by
        db.execute("UPDATE bans SET kind = ?, by = ? WHERE peer = ?", (str(kind), who, peer))
