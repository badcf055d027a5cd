"""The dashboard of a real run, watched live in a real headless browser.

``test_swarm``'s main swarm (three honest nodes, an attacker banned on the honest majority's
evidence, a late joiner) is watched by Chromium: :func:`watch_dashboard` opens the page before
the rounds begin and it is never reloaded, so whatever :func:`check_live_run` finds at the end
arrived by polling. One swarm for both (the suite's time: the swarm was started twice before).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cnode.node.coordinator import BanKind
from tests.support.browser import Page, has_chromium, open_page

from .swarm import Node, Swarm


@contextmanager
def browser_page(profile: Path) -> Iterator[Page | None]:
    """A headless tab, or None where chromium is missing (the test skips its page checks)."""
    if not has_chromium():
        yield None
        return
    with open_page(profile) as page:
        yield page


def watch_dashboard(page: Page, swarm: Swarm) -> None:
    """Open the coordinator's page before the rounds begin, and mark the document."""
    page.navigate(f"{swarm.coordinator.url}/")
    page.wait_for("document.body.dataset.version", 30, "a first poll")
    page.evaluate("window.__sameDocument = true")  # gone if the page were ever reloaded


def check_live_run(
    page: Page, swarm: Swarm, checkpointer: Node, evil: Node, late: Node, rounds: int, shot: Path
) -> None:
    """What a person watching the run sees: losses, rounds, the ban, checkpoints, the catch-up."""
    (ban,) = swarm.run_state().bans
    assert ban.peer == evil.peer

    # Loss: one point per round, each the value the nodes wrote to their own reports.
    page.wait_for(
        f"document.querySelectorAll('#loss-chart circle.loss-point').length === {rounds}",
        30,
        f"{rounds} loss points",
    )
    points = page.evaluate(
        "[...document.querySelectorAll('#loss-chart circle.loss-point')]"
        ".map(p => [Number(p.dataset.round), Number(p.dataset.loss)])"
    )
    assert points == [[e["round"], e["loss"]] for e in checkpointer.events("round")]
    sources = page.evaluate(
        "[...document.querySelectorAll('#loss-table tr.loss-row')].map(r => r.textContent)"
    )
    assert all("signed" in s for s in sources), sources

    # Rounds and their members: the honest peers ready in every round; the attacker banned.
    page.wait_for(
        "document.querySelectorAll('#rounds-table tr.round').length >= " + str(rounds),
        30,
        "the round rows",
    )
    members = page.evaluate(
        "[...document.querySelectorAll('#rounds-table tr.member')]"
        ".map(m => [m.querySelector('.cid').title, m.querySelector('.state').textContent])"
    )
    assert [checkpointer.peer, "ready"] in members
    assert [late.peer, "ready"] in members
    assert {state for peer, state in members if peer == evil.peer} <= {"ready", "banned"}
    # Each member's reachability, as the coordinator's dial-back found it (issue 37): every
    # node here listens on loopback in a run that allows it, so every one is public.
    reach = page.evaluate(
        "[...document.querySelectorAll('#rounds-table tr.member .reach')].map(c => c.textContent)"
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
    assert page.screenshot(shot).stat().st_size > 10_000
