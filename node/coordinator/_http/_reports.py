"""Signed node reports: what nodes measured (held-out loss, catch-up), for the dashboard.

A node POSTs ``report`` (a ``cnode/request/v1`` envelope, like every other request) after each
round with the held-out loss it computed and the checkpoint it now holds, and after a late join
with its catch-up time and bytes per holder. See specs/coordinator.md#reports.

Reports are telemetry, not run state: they live in their own table (created by the store's
``_pages.py``, outside the run schema), never change the state version, and are never signed back.
Each one is bounded (one row per kind, round and peer; a round report only from a member of that
round's published list; a catch-up report only for a recorded checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .. import limits
from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from .._store._pages import Pages
from .._store._store import Store
from .._wire._protocol import CatchUpSource, ReportKind
from ._requests import _cid, parse_round, require

__all__ = ["ReportBook", "parse_report"]


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
    text = require(args, "kind", str)
    if text not in set(ReportKind):
        kinds = tuple(str(k) for k in ReportKind)
        raise RequestRefused(E.BAD_REQUEST, f"report kind must be one of {kinds}")
    kind = ReportKind(text)
    body: dict[str, Any] = {"kind": str(kind), "round": parse_round(args)}
    if kind is ReportKind.ROUND:
        body["loss"] = _number(args, "loss")
        body["state"] = _cid_text(args, "state")
        body["holds"] = _cid_text(args, "holds")
        return body
    body["manifest"] = _cid_text(args, "manifest")
    body["seconds"] = _number(args, "seconds")
    body["bytes"] = int(_number(args, "bytes", integer=True))
    source = require(args, "source", str)
    if source not in set(CatchUpSource):
        raise RequestRefused(E.BAD_REQUEST, "source must be 'peers' or 'hub'")
    body["source"] = str(CatchUpSource(source))
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
    """Node reports: checked, stored through the store's :class:`Pages`; every method runs on
    the server's event loop thread."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pages = Pages(store)
        # Bumped on every stored report: the dashboard's cache key (reports leave the state
        # version alone, see the module docstring).
        self.seq = 0

    def record(self, peer: str, body: dict[str, Any], now: float) -> dict[str, Any]:
        """Store one checked report (inside the caller's transaction); refuse strangers."""
        s, n = self.store, int(body["round"])
        if body["kind"] == ReportKind.ROUND:
            row = s.round_row(n)
            published = row.members if row is not None else []
            if peer not in published:
                raise RequestRefused(E.NOT_MEMBER, f"peer {peer} is no member of round {n}")
        else:
            ckpt = s.checkpoint(n)
            if ckpt is None or ckpt.manifest != body["manifest"]:
                raise RequestRefused(
                    E.UNKNOWN_CHECKPOINT, f"no checkpoint {body['manifest']} of round {n}"
                )
        self.pages.put_report(body["kind"], n, peer, body, now)
        self.seq += 1
        return {"stored": True}
