"""Signed node reports: what nodes measured (held-out loss, catch-up), for the dashboard.

A node POSTs ``report`` (a ``cnode/request/v1`` envelope, like every other request) after each
round with the held-out loss it computed and the checkpoint it now holds, and after a late join
with its catch-up time and bytes per holder. See specs/coordinator.md#reports.

Reports are telemetry, not run state: they live in their own table (created here, so the run
schema of ``_store.py`` is untouched), never change the state version, and are never signed back.
Each one is bounded (one row per kind, round and peer; a round report only from a member of that
round's published list; a catch-up report only for a recorded checkpoint).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .. import limits
from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from .._store._store import Store
from ._requests import _cid, parse_round, require

__all__ = ["ReportBook", "parse_report"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    kind TEXT NOT NULL, round INTEGER NOT NULL, peer TEXT NOT NULL, body TEXT NOT NULL,
    at REAL NOT NULL, PRIMARY KEY (kind, round, peer));
"""

_KINDS = ("round", "catch_up")


def _cid_text(args: Mapping[str, Any], key: str) -> str | None:
    return None if args.get(key) is None else _cid(args, key)


def _number(args: Mapping[str, Any], key: str, *, integer: bool = False) -> float:
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise RequestRefused(E.BAD_REQUEST, f"field {key!r} must be a number")
    # An int is compared exactly (float() of 10**400 would raise OverflowError).
    finite = isinstance(value, int) or math.isfinite(value)
    if not finite or not 0 <= value <= limits.MAX_REPORT_NUMBER:
        raise RequestRefused(
            E.BAD_REQUEST, f"field {key!r} must be finite, >= 0 and at most MAX_REPORT_NUMBER"
        )
    return float(value)


def parse_report(args: Mapping[str, Any]) -> dict[str, Any]:
    """Check a report's arguments (types, bounds); return the body to store."""
    kind = require(args, "kind", str)
    if kind not in _KINDS:
        raise RequestRefused(E.BAD_REQUEST, f"report kind must be one of {_KINDS}")
    body: dict[str, Any] = {"kind": kind, "round": parse_round(args)}
    if kind == "round":
        body["loss"] = _number(args, "loss")
        body["state"] = _cid_text(args, "state")
        body["holds"] = _cid_text(args, "holds")
        return body
    body["manifest"] = _cid_text(args, "manifest")
    body["seconds"] = _number(args, "seconds")
    body["bytes"] = int(_number(args, "bytes", integer=True))
    source = require(args, "source", str)
    if source not in ("peers", "hub"):
        raise RequestRefused(E.BAD_REQUEST, "source must be 'peers' or 'hub'")
    body["source"] = source
    per_holder = require(args, "bytes_per_holder", dict)
    if len(per_holder) > limits.MAX_REPORT_HOLDERS:
        raise RequestRefused(E.BAD_REQUEST, "bytes_per_holder over MAX_REPORT_HOLDERS")
    holders: dict[str, int] = {}
    for peer in per_holder:
        if not isinstance(peer, str) or not 0 < len(peer) <= limits.MAX_CID_CHARS:
            raise RequestRefused(E.BAD_REQUEST, "bytes_per_holder keys must be peer ids")
        holders[peer] = int(_number(per_holder, peer, integer=True))
    body["bytes_per_holder"] = holders
    return body


class ReportBook:
    """The ``reports`` table; every method runs on the server's event loop thread."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.db.executescript(_SCHEMA)
        # Bumped on every stored report: the dashboard's cache key (reports leave the state
        # version alone, see the module docstring).
        self.seq = 0

    def record(self, peer: str, body: dict[str, Any], now: float) -> dict[str, Any]:
        """Store one checked report (inside the caller's transaction); refuse strangers."""
        s, n = self.store, int(body["round"])
        if body["kind"] == "round":
            row = s.round_row(n)
            published = json.loads(row["members"] or "[]") if row is not None else []
            if peer not in published:
                raise RequestRefused(E.NOT_MEMBER, f"peer {peer} is no member of round {n}")
        else:
            ckpt = s.db.execute("SELECT manifest FROM checkpoints WHERE round = ?", (n,)).fetchone()
            if ckpt is None or ckpt["manifest"] != body["manifest"]:
                raise RequestRefused(
                    E.UNKNOWN_CHECKPOINT, f"no checkpoint {body['manifest']} of round {n}"
                )
        s.db.execute(
            "INSERT OR REPLACE INTO reports VALUES (?, ?, ?, ?, ?)",
            (body["kind"], n, peer, json.dumps(body, sort_keys=True), now),
        )
        self.seq += 1
        return {"stored": True}

    def round_reports(self, first: int, last: int) -> list[tuple[int, str, dict[str, Any]]]:
        """(round, peer, body) of the round reports of rounds first..last, by round then peer."""
        rows = self.store.db.execute(
            "SELECT round, peer, body FROM reports WHERE kind = 'round' AND round BETWEEN ? AND ? "
            "ORDER BY round, peer",
            (first, last),
        ).fetchall()
        return [(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]

    def holders(self, manifest: str, limit: int) -> list[str]:
        """Peers that reported holding ``manifest`` (after a round or a catch-up)."""
        rows = self.store.db.execute(
            "SELECT DISTINCT peer FROM reports WHERE json_extract(body, '$.holds') = ? "
            "OR json_extract(body, '$.manifest') = ? ORDER BY peer LIMIT ?",
            (manifest, manifest, limit),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def catch_ups(self, limit: int) -> list[dict[str, Any]]:
        """The newest catch-up reports, newest first."""
        rows = self.store.db.execute(
            "SELECT peer, body, at FROM reports WHERE kind = 'catch_up' ORDER BY at DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [{"peer": r[0], "at_ms": int(r[2] * 1000), **json.loads(r[1])} for r in rows]
