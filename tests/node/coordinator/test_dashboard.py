"""The dashboard: its JSON from signed node reports, its headers, and peer text in a browser.

A real coordinator (in a thread, real SQLite), real signed requests through the real client, and
for the rendering test a real headless chromium (tests/support/browser.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from cnode.auth import Identity, make_hf_binding, save_identity
from cnode.node.coordinator import (
    AccessConfig,
    CoordinatorClient,
    CoordinatorRejected,
    RoundsConfig,
    RunConfig,
)
from cnode.node.coordinator import limits as coordinator_limits
from cnode.storage import compute_cid
from tests.support.browser import open_page
from tests.support.forked import ForkedCoordinatorProcess
from tests.support.hf_hub import FakeHub

from .conftest import Running, run_config

MANIFEST = str(compute_cid(b"a checkpoint manifest"))


def _client(running: Running, peer: Identity) -> CoordinatorClient:
    return CoordinatorClient(
        running.url, run=running.server.run, coordinator=running.peer_id, identity=peer
    )


async def _one_round(running: Running, members: list[Identity]) -> list[CoordinatorClient]:
    """Join, play round 1 to its published list; the clients stay open (the caller closes)."""
    clients = [_client(running, p) for p in members]
    for c in clients:
        await c.join()
    for c in clients:
        assert await c.join_round() == 1
    for c in clients:
        await c.ready(1)
    info = await clients[0].wait_members(1)
    assert sorted(info.members) == sorted(p.peer_id_str for p in members)
    return clients


def _dashboard(running: Running) -> dict[str, Any]:
    answer = httpx.get(f"{running.url}/v1/runs/{running.server.run}/dashboard")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    data: dict[str, Any] = answer.json()
    return data


def test_reports_feed_the_loss_chart_checkpoint_holders_and_catch_up(
    serve: Any, peers: list[Identity]
) -> None:
    members, late = peers[:3], peers[3]
    running: Running = serve(run_config(peers, min_participants=3, checkpoint_every=1))

    async def play() -> None:
        clients = await _one_round(running, members)
        late_client = _client(running, late)
        await late_client.join()
        try:
            await clients[0].submit_checkpoint(
                epoch=0, round=1, manifest=MANIFEST, hf_repo="acme/run", hf_revision="c0ffee"
            )
            for c, loss in zip(clients, (2.5, 2.5, 9.75), strict=True):  # the last one dissents
                await c.report({"kind": "round", "round": 1, "loss": loss, "holds": MANIFEST})
            with pytest.raises(CoordinatorRejected) as err:  # not a member of round 1
                await late_client.report({"kind": "round", "round": 1, "loss": 1.0})
            assert err.value.code == "not_member"
            catch_up = {
                "kind": "catch_up", "round": 1, "manifest": MANIFEST, "seconds": 1.25,
                "bytes": 300, "source": "peers",
                "bytes_per_holder": {members[0].peer_id_str: 100, members[1].peer_id_str: 200},
            }  # fmt: skip
            with pytest.raises(CoordinatorRejected) as err:  # no such checkpoint
                await late_client.report({**catch_up, "manifest": str(compute_cid(b"other"))})
            assert err.value.code == "unknown_checkpoint"
            too_many = {f"peer{i}": 1 for i in range(coordinator_limits.MAX_REPORT_HOLDERS + 1)}
            with pytest.raises(CoordinatorRejected) as err:
                await late_client.report({**catch_up, "bytes_per_holder": too_many})
            assert err.value.code == "bad_request"
            with pytest.raises(CoordinatorRejected) as err:
                await late_client.report({**catch_up, "seconds": -1.0})
            assert err.value.code == "bad_request"
            await late_client.report(catch_up)
        finally:
            for c in [*clients, late_client]:
                await c.aclose()

    version_before = None
    asyncio.run(play())
    d = _dashboard(running)
    # Reports are telemetry: they never move the signed state's version.
    with running.admin() as admin:
        version_before = admin.run_state().version
    assert d["version"] == version_before
    assert d["run"] == "test-run" and d["coordinator"] == running.peer_id
    (point,) = d["loss"]
    assert point == {
        "round": 1, "loss": 2.5, "source": "signed reports", "reporters": 2, "dissent": 1,
        "members": 3, "checkpointer": True,
    }  # fmt: skip
    round1 = next(r for r in d["rounds"] if r["round"] == 1)
    assert round1["status"] == "published" and round1["published_at_ms"]
    assert {m["status"] for m in round1["members"]} == {"ready"}
    assert round1["member_count"] == 3
    (ckpt,) = [c for c in d["checkpoints"] if c["round"] == 1]
    assert ckpt["manifest"] == MANIFEST
    assert (ckpt["hf_repo"], ckpt["hf_revision"]) == ("acme/run", "c0ffee")
    assert set(ckpt["holders"]) == {p.peer_id_str for p in peers}  # 3 after the round, 1 caught up
    (caught,) = d["catch_ups"]
    assert caught["peer"] == late.peer_id_str and caught["bytes"] == 300
    assert caught["bytes_per_holder"][members[1].peer_id_str] == 200
    assert {p["peer"] for p in d["peers"]} == {p.peer_id_str for p in peers}
    assert len(d["allowlist"]) == 4


def test_page_script_and_json_carry_the_security_headers(serve: Any, peers: list[Identity]) -> None:
    running: Running = serve(run_config(peers))
    page = httpx.get(f"{running.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/dashboard/dashboard.js"' in page.text
    assert "<script>" not in page.text  # no inline script: the CSP would refuse it anyway
    script = httpx.get(f"{running.url}/dashboard/dashboard.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in script.text.replace("no innerHTML", "")
    for answer in (page, script, httpx.get(f"{running.url}/v1/runs/test-run/dashboard")):
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{running.url}/dashboard/../_server.py").status_code == 404
    assert httpx.get(f"{running.url}/dashboard/secret.key").status_code == 404
    assert httpx.get(f"{running.url}/v1/runs/other/dashboard").status_code == 404


def test_serve_logs_the_dashboard_url(tmp_path: Path, peers: list[Identity]) -> None:
    key = Identity.generate()
    save_identity(key, tmp_path / "coordinator.key")
    config = replace(run_config(peers), coordinator=key.peer_id_str)
    (tmp_path / "run.toml").write_text(tomli_w.dumps(config.to_dict()))
    with ForkedCoordinatorProcess(
        tmp_path / "run.toml", tmp_path / "c.db", tmp_path / "coordinator.key"
    ) as proc:
        lines = [json.loads(x) for x in proc.log_tail(20_000).splitlines() if x.startswith("{")]
        (logged,) = [x["url"] for x in lines if x.get("event") == "dashboard"]
        assert logged == f"{proc.url}/"
        assert "cnode dashboard" in httpx.get(logged).text


HOSTILE_USER = '<img src=x onerror="window.__pwned=1">'
HOSTILE_REASON = '<script>window.__pwned=2</script><img src=x onerror="window.__pwned=3">'


def test_peer_supplied_text_renders_as_text_and_runs_nothing(serve: Any, tmp_path: Path) -> None:
    """A username and a ban reason holding markup show as those characters, and no script runs.

    The CSP alone would block the inline handlers; the test also checks that no <img> or
    <script> element was created, which is what textContent (rather than innerHTML) guarantees.
    """
    with FakeHub() as hub:
        config = RunConfig(
            run="test-run",
            rounds=RoundsConfig(min_participants=2),
            access=AccessConfig(users=[HOSTILE_USER]),
        )
        running: Running = serve(config, hf_endpoint=hub.url)
        mallory = Identity.generate()
        token = hub.add_user(HOSTILE_USER)
        binding = make_hf_binding(mallory, HOSTILE_USER, int(time.time()))
        with running.client(mallory) as c:
            assert c.join(hf_binding=binding, hf_token=token).username == HOSTILE_USER
        with running.admin() as admin:
            admin.ban(mallory.peer_id_str, HOSTILE_REASON)
        with open_page(tmp_path / "profile") as page:
            page.navigate(f"{running.url}/")
            page.wait_for(
                "document.querySelectorAll('#bans-table tr.ban').length === 1", 30, "the ban row"
            )
            reason = page.evaluate(
                "document.querySelector('#bans-table tr.ban .reason').textContent"
            )
            assert reason == HOSTILE_REASON
            decided = page.evaluate("document.querySelector('#bans-table tr.ban .by').textContent")
            assert decided.startswith(f"admin an admin (…{running.peer_id[-12:]}) at "), decided
            names = page.evaluate(
                "[...document.querySelectorAll('.username')].map(e => e.textContent)"
            )
            assert HOSTILE_USER in names
            allow = page.evaluate("document.querySelector('#allowlist-table').textContent")
            assert HOSTILE_USER in allow
            # No element was made from the markup, and nothing it carried ran.
            assert page.evaluate("document.querySelectorAll('main img, main script').length") == 0
            assert page.evaluate("window.__pwned === undefined")
            assert page.evaluate("document.querySelectorAll('script').length") == 1  # ours
            page.screenshot(tmp_path / "hostile.png")
        assert not [e for e in page.events if e["method"] == "Page.javascriptDialogOpening"]


# A reputation ban's figures as a node reports them: per-round scores are maps.
_SCORE = {"own_before": 6.93, "own_after": 29.15, "held_before": 6.92, "score": -20000}
_REPUTATION_FIGURES = {
    "rounds": [1, 2],
    "reputations": [-5000, -8750],
    "bounds": [-25, -25],
    "scores": [_SCORE, _SCORE],
}


def test_a_ban_shows_its_kind_who_decided_and_figure_maps_as_text(
    serve: Any, peers: list[Identity], tmp_path: Path
) -> None:
    running = serve(run_config(peers, min_participants=4))
    accused = peers[3].peer_id_str
    evidence = {
        "peer": accused,
        "round": 1,
        "kind": "reputation",
        "reason": "reputation below the ban bound in 2 rounds in a row",
        "update_cid": MANIFEST,
        "figures": _REPUTATION_FIGURES,
    }

    async def main() -> None:
        clients = [_client(running, p) for p in peers]
        for c in clients:
            await c.join()
            await c.join_round()
        for c in clients:
            await c.ready(1)
        await clients[0].wait_members(1)
        assert not (await clients[0].report_ban_evidence(evidence)).banned
        assert (await clients[1].report_ban_evidence(evidence)).banned  # no checker: a majority
        for c in clients:
            await c.aclose()

    asyncio.run(main())
    (shown,) = httpx.get(f"{running.url}/v1/runs/test-run/dashboard").json()["bans"]
    assert (shown["kind"], shown["by"], shown["others"]) == ("majority", peers[1].peer_id_str, 3)
    assert [r["kind"] for r in shown["reports"]] == ["reputation", "reputation"]
    with open_page(tmp_path / "profile") as page:
        page.navigate(f"{running.url}/")
        page.wait_for("!!document.querySelector('#bans-table tr.ban')", 30, "the ban row")
        decided = page.evaluate("document.querySelector('#bans-table tr.ban .by').textContent")
        assert decided.startswith(
            f"majority a majority of the round's other members (2 of 3), last report of "
            f"…{peers[1].peer_id_str[-12:]} at "
        ), decided
        cells = page.evaluate(
            "[...document.querySelectorAll('#bans-table table.figures td')].map(e => e.innerText)"
        )
        assert cells and not [c for c in cells if "object" in c], cells
        # one cell per round's score map, a line per key (figures are JSON with sorted keys)
        assert "held_before 6.92000\nown_after 29.1500\nown_before 6.93000\nscore -20000" in cells
