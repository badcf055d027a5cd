"""The coordinator's read-only dashboard: one static page, its script, and the JSON it polls.

See specs/coordinator.md#dashboard. ``GET /`` is a static HTML page; ``GET /dashboard/<file>`` its
script and style sheet, shipped inside the package (no CDN: the page works offline); the script
polls ``GET /v1/runs/<run>/dashboard`` (unsigned JSON, every list capped by a ``DASHBOARD_*``
limit) and draws everything with ``textContent`` and SVG elements, never as HTML, because peer
ids, usernames, ban reasons and figures are peer-supplied. Every answer of the server carries a
Content-Security-Policy that allows scripts from this origin only (no inline script), and
``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from typing import Any

from aiohttp import web

from .. import limits
from .._store._rows import RoundRow
from .._store._store import Store
from ._dialback import Reachability
from ._driver import RunDriver
from ._reports import ReportBook

__all__ = ["SECURITY_HEADERS", "Dashboard"]

# Sent with every answer of the coordinator (the JSON API too: harmless there, and one rule is
# easier to check than two). 'self' only: the page's script and style come from this server.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

# The packaged files the page is made of, and their content types.
_STATIC = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}


def _ms(t: Any) -> int | None:
    return None if t is None else int(float(t) * 1000)


PUBLIC, OUTBOUND_ONLY = str(Reachability.PUBLIC), str(Reachability.OUTBOUND_ONLY)


class Dashboard:
    """Routes and JSON of the dashboard of one run, over the coordinator's own store."""

    def __init__(self, store: Store, driver: RunDriver, run: str, coordinator: str) -> None:
        self.store = store
        self.driver = driver
        self.run = run
        self.coordinator = coordinator
        self.reports = ReportBook(store)
        folder = resources.files("cnode.node.coordinator").joinpath("static")
        # Read once: three small files; a missing one is a broken install and fails at start.
        self._files = {name: folder.joinpath(name).read_bytes() for name in _STATIC}
        self._cache: tuple[tuple[int, int, str | None], bytes] | None = None

    def install(self, app: web.Application) -> None:
        app.on_response_prepare.append(_add_security_headers)
        app.add_routes(
            [
                web.get("/", self._page),
                web.get("/dashboard/{name}", self._static),
                web.get("/v1/runs/{run}/dashboard", self._json),
            ]
        )

    async def _page(self, _request: web.Request) -> web.Response:
        return self._file("index.html")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _STATIC or name == "index.html":
            raise web.HTTPNotFound(text="no such file")
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        return web.Response(
            body=self._files[name],
            content_type=_STATIC[name],
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def _json(self, request: web.Request) -> web.Response:
        if request.match_info["run"] != self.run:
            raise web.HTTPNotFound(text="unknown run")
        key = (self.store.version(), self.reports.seq, self.store.run_row().waiting)
        if self._cache is None or self._cache[0] != key:
            # Rebuilt only after a change: many viewers polling cost one query set per change.
            self._cache = (key, json.dumps(self.view(time.time())).encode())
        return web.Response(
            body=self._cache[1],
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    # -- the JSON view ----------------------------------------------------------------------------

    def view(self, now: float) -> dict[str, Any]:
        """Everything the page shows; each list capped (specs/coordinator.md#dashboard)."""
        s, pages = self.store, self.reports.pages
        run = s.run_row()
        current = run.round
        rounds_cfg = self.driver.config.rounds
        return {
            "run": self.run,
            "coordinator": self.coordinator,
            "version": s.version(),
            "at_ms": int(now * 1000),
            "poll_s": limits.DASHBOARD_POLL_S,
            "phase": run.phase,
            "phase_until_ms": _ms(run.phase_until),
            "epoch": run.epoch,
            "round": current,
            "waiting": run.waiting,
            "rules": {
                "min_participants": rounds_cfg.min_participants,
                "round_timeout_s": rounds_cfg.round_timeout_s,
                "checkpoint_every": rounds_cfg.checkpoint_every,
            },
            "loss": self._loss(current),
            "rounds": self._rounds(current),
            "bans": self._bans(),
            "checkpoints": self._checkpoints(),
            "catch_ups": pages.catch_ups(limits.DASHBOARD_CATCH_UPS),
            "peers": self._peers(pages.peers(limits.DASHBOARD_PEERS)),
            "allowlist": [
                {"kind": e["kind"], "value": e["value"]}
                for e in s.allowlist(limits.DASHBOARD_PEERS)
            ],
            "totals": {"rounds": current, **pages.totals()},
        }

    def _loss(self, current: int) -> list[dict[str, Any]]:
        """Per round, the held-out loss most members reported, and who said so.

        Honest nodes hold bit-identical weights and evaluate the same held-out set, so their
        losses are equal to the bit; a value a minority reports (an attacker's) is counted as
        dissent, not plotted.
        """
        first = max(1, current - limits.DASHBOARD_LOSS_ROUNDS)
        by_round: dict[int, list[tuple[str, float]]] = {}
        for n, peer, body in self.reports.pages.round_reports(first, current):
            by_round.setdefault(n, []).append((peer, float(body["loss"])))
        submitters = self.reports.pages.submitters(first)
        out = []
        for n, values in sorted(by_round.items()):
            tally = Counter(v for _, v in values)
            loss, agree = max(tally.items(), key=lambda kv: (kv[1], -kv[0]))
            row = self.store.round_row(n)
            out.append(
                {
                    "round": n,
                    "loss": loss,
                    "source": "signed reports",
                    "reporters": agree,
                    "dissent": len(values) - agree,
                    "members": 0 if row is None else len(row.members),
                    "checkpointer": any(p == submitters.get(n) and v == loss for p, v in values),
                }
            )
        return out

    def _reachability(self, peers: list[str]) -> dict[str, str]:
        """Peer -> ``public`` or ``outbound-only``, as its last join's dial-back found it: only
        addresses dialed back are stored (specs/coordinator.md#reachability)."""
        dialable = self.store.peer_addrs(peers)
        return {p: PUBLIC if dialable.get(p) else OUTBOUND_ONLY for p in peers}

    def _peers(self, rows: Sequence[Any]) -> list[dict[str, Any]]:
        reach = self._reachability([p.peer for p in rows])
        return [
            {
                "peer": p.peer,
                "username": p.username,
                "joined_at_ms": _ms(p.joined_at),
                "reachability": reach[p.peer],
            }
            for p in rows
        ]

    def _rounds(self, current: int) -> list[dict[str, Any]]:
        pages = self.reports.pages
        out = []
        for row in pages.rounds(current + 1, limits.DASHBOARD_ROUNDS):
            n = row.round
            members, total = pages.members(n, limits.DASHBOARD_MEMBERS)
            reach = self._reachability([m.peer for m in members])
            out.append(
                {
                    "round": n,
                    "epoch": row.epoch,
                    "status": row.status,
                    "opened_at_ms": _ms(row.opened_at),
                    "closed_at_ms": _ms(row.closed_at),
                    "deadline_ms": _ms(row.deadline),
                    "published_at_ms": _ms(row.published_at),
                    # The round's one agreed input set (specs/coordinator.md#agreement).
                    "agreed_at_ms": _ms(row.agreed_at),
                    "excluded": row.excluded,
                    "member_count": total,
                    **self._partitions(row),
                    "members": [
                        {
                            "peer": m.peer,
                            "username": m.username,
                            "status": m.status,
                            "joined_at_ms": _ms(m.joined_at),
                            "ready_at_ms": _ms(m.ready_at),
                            "header": m.header,
                            "reachability": reach.get(m.peer, OUTBOUND_ONLY),
                        }
                        for m in members
                    ],
                }
            )
        return out

    def _partitions(self, row: RoundRow) -> dict[str, Any]:
        """A partitioned round's parts, and per partition (the first DASHBOARD_PARTITIONS) its
        aggregator and recorded result (specs/coordinator.md#partitioned-rounds)."""
        n, parts = row.round, row.parts
        if parts == 0:
            return {"parts": 0, "partitions": []}
        aggregators = self.driver.partitions.aggregators(row)
        results = self.store.results(n)
        shown = []
        for p in range(min(parts, limits.DASHBOARD_PARTITIONS)):
            r = results.get(p)
            result = None
            if r is not None:
                result = {
                    "peer": r.peer,
                    "header": r.header,
                    "replaced": r.replaced,
                    "by": r.by,
                    "at_ms": _ms(r.at),
                }
            shown.append({"partition": p, "aggregator": aggregators[p], "result": result})
        return {"parts": parts, "partitions": shown}

    def _bans(self) -> list[dict[str, Any]]:
        s = self.store
        out = []
        for b in s.ban_rows(limits.DASHBOARD_BANS):
            evidence = b.evidence
            reports = s.ban_reports(b.peer, limits.DASHBOARD_EVIDENCE)
            out.append(
                {
                    "peer": b.peer,
                    "username": b.username,
                    "kind": b.kind,
                    "reason": b.reason,
                    "round": b.round,
                    "by": b.by,
                    "by_username": s.peer_username(b.by) if b.by else "",
                    "others": evidence.get("others"),  # majority bans: the round's other members
                    "at_ms": _ms(b.at),
                    "update_cid": evidence.get("update_cid"),
                    "figures": evidence.get("figures"),
                    "reports": [
                        {
                            "round": r.round,
                            "reporter": r.reporter,
                            "kind": r.kind,
                            "reason": r.reason,
                            "update_cid": r.update_cid,
                            "figures": r.figures,
                            "at_ms": _ms(r.at),
                        }
                        for r in reports
                    ],
                }
            )
        return out

    def _checkpoints(self) -> list[dict[str, Any]]:
        pages = self.reports.pages
        return [
            {
                "round": r.round,
                "epoch": r.epoch,
                "manifest": r.manifest,
                "hf_repo": r.hf_repo,
                "hf_revision": r.hf_revision,
                "submitter": r.submitter,
                "at_ms": _ms(r.at),
                "holders": pages.holders(r.manifest, limits.DASHBOARD_HOLDERS),
            }
            for r in pages.checkpoints(limits.DASHBOARD_CHECKPOINTS)
        ]


async def _add_security_headers(_request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
