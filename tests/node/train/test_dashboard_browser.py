"""The dashboard of a real run, watched live in a real headless browser.

A coordinator process, three honest ``cnode train`` processes, an attacker (banned on the honest
majority's evidence) and a late joiner, as in test_swarm. Chromium opens the dashboard before the
rounds begin and is never reloaded: whatever the page shows at the end arrived by polling.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cnode.node.coordinator import BanKind
from tests.support.browser import chromium_or_skip, open_page

from .swarm import Swarm

pytestmark = pytest.mark.slow

ROUNDS = 5


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    chromium_or_skip()  # before starting six processes for nothing
    made = Swarm(tmp_path, ["a", "b", "c", "evil", "late"], min_participants=3)
    try:
        yield made
    finally:
        made.close()


def test_the_dashboard_shows_a_live_run_with_its_ban(swarm: Swarm, tmp_path: Path) -> None:
    with open_page(tmp_path / "profile") as page:
        page.navigate(f"{swarm.coordinator.url}/")
        page.wait_for("document.body.dataset.version", 30, "a first poll")
        page.evaluate("window.__sameDocument = true")  # gone if the page were ever reloaded

        a = swarm.start("a", rounds=ROUNDS, checkpointer=True)
        b = swarm.start("b", rounds=ROUNDS)
        c = swarm.start("c", rounds=ROUNDS)
        evil = swarm.start("evil", "--attack", "gaussian", rounds=ROUNDS)
        late = swarm.start("late", "--join-after-round", "2", rounds=ROUNDS)
        for node in (a, b, c, late):
            assert swarm.wait_exit(node, timeout=300) == 0, swarm.describe()
        (ban,) = swarm.run_state().bans
        assert ban.peer == evil.peer

        # Loss: one point per round, each the value the nodes wrote to their own reports.
        page.wait_for(
            f"document.querySelectorAll('#loss-chart circle.loss-point').length === {ROUNDS}",
            30,
            f"{ROUNDS} loss points",
        )
        points = page.evaluate(
            "[...document.querySelectorAll('#loss-chart circle.loss-point')]"
            ".map(p => [Number(p.dataset.round), Number(p.dataset.loss)])"
        )
        expected = [[e["round"], e["loss"]] for e in a.events("round")]
        assert points == expected
        sources = page.evaluate(
            "[...document.querySelectorAll('#loss-table tr.loss-row')].map(r => r.textContent)"
        )
        assert all("signed" in s for s in sources), sources

        # Rounds and their members: the honest peers ready in every round; the attacker banned.
        page.wait_for(
            "document.querySelectorAll('#rounds-table tr.round').length >= " + str(ROUNDS),
            30,
            "the round rows",
        )
        members = page.evaluate(
            "[...document.querySelectorAll('#rounds-table tr.member')]"
            ".map(m => [m.querySelector('.cid').title, m.querySelector('.state').textContent])"
        )
        assert [a.peer, "ready"] in members
        assert [late.peer, "ready"] in members
        assert {state for peer, state in members if peer == evil.peer} <= {"ready", "banned"}
        # Each member's reachability, as the coordinator's dial-back found it (issue 37): every
        # node here listens on loopback in a run that allows it, so every one is public.
        reach = page.evaluate(
            "[...document.querySelectorAll('#rounds-table tr.member .reach')]"
            ".map(c => c.textContent)"
        )
        assert reach and set(reach) == {"public"}, reach
        peers_reach = page.evaluate(
            "[...document.querySelectorAll('#peers-table tr.peer .reach')].map(c => c.textContent)"
        )
        assert peers_reach and set(peers_reach) == {"public"}, peers_reach

        # The ban row, with the coordinator's reason and the reporters' evidence.
        page.wait_for("!!document.querySelector('#bans-table tr.ban')", 30, "the ban row")
        reason = page.evaluate("document.querySelector('#bans-table tr.ban .reason').textContent")
        assert reason == ban.reason
        assert page.evaluate("document.querySelector('#bans-table tr.ban .cid').title") == evil.peer
        # Its kind, and who decided it in words: "checked by the coordinator (report of …)".
        decided = page.evaluate("document.querySelector('#bans-table tr.ban .by').textContent")
        words = {BanKind.CHECKED: "checked by the coordinator (report of …"}
        words[BanKind.MAJORITY] = "a majority of the round's other members ("
        assert decided.startswith(f"{ban.kind} {words[ban.kind]}"), decided
        assert "[object" not in page.evaluate("document.querySelector('#bans-table').innerText")
        reporters = page.evaluate(
            "[...document.querySelectorAll('#bans-table .reporter .cid')].map(e => e.title)"
        )
        # The coordinator may ban on one report it checked itself.
        assert reporters and evil.peer not in reporters
        # The figures per round: one row per round of the evidence.
        assert page.evaluate("document.querySelectorAll('#bans-table table.figures tr').length")

        # Checkpoints with holders, and the late joiner's catch-up with bytes per holder.
        page.wait_for(
            "document.querySelectorAll('#catch-ups-table tr.catch-up').length === 1",
            30,
            "the late joiner's catch-up",
        )
        catch_up = page.evaluate("document.querySelector('#catch-ups-table tr.catch-up').innerText")
        assert "bytes" in catch_up
        assert page.evaluate("document.querySelectorAll('#checkpoints-table tr.checkpoint').length")
        assert page.evaluate("window.__sameDocument") is True
        shot = page.screenshot(tmp_path / "dashboard.png")
    assert shot.stat().st_size > 10_000
