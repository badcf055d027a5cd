"""``GET /metrics`` on a real coordinator: requests by route and status, and the run's figures."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cnode.auth import Identity
from tests.support.metrics import scrape, value

from .conftest import Running, run_config

RUN = "/v1/runs/{run}"


@pytest.fixture
def running(serve: Any, peers: list[Identity]) -> Running:
    r: Running = serve(run_config(peers[:3], min_participants=2))
    return r


def test_metrics_count_answers_by_route_and_read_the_run_from_the_store(
    running: Running, peers: list[Identity]
) -> None:
    with running.client(peers[0]) as client:
        client.join()
    base = f"{running.url}/v1/runs/{running.server.run}"
    assert httpx.get(f"{base}/rounds/99999999999999999999").status_code == 400
    assert httpx.get(f"{running.url}/no/such/path").status_code == 404
    assert httpx.get(f"{running.url}/no/such/other/path").status_code == 404

    samples = scrape(f"{running.url}/metrics")

    assert value(samples, "cnode_coordinator_requests_total", route=f"{RUN}/join", status="200")
    # A refusal is counted with the status it was answered with (400), not as a crash.
    assert value(
        samples, "cnode_coordinator_requests_total", route=f"{RUN}/rounds/{{round}}", status="400"
    )
    # Paths no route serves share one label: a scanner cannot grow the label set.
    unmatched = value(samples, "cnode_coordinator_requests_total", route="unmatched", status="404")
    assert unmatched == 2
    assert not [s for s in samples["cnode_coordinator_requests_total"] if s[0]["status"] == "500"]
    assert value(samples, "cnode_coordinator_round") == 1
    assert value(samples, "cnode_coordinator_phase", phase="WaitingForMembers") == 1
    assert value(samples, "cnode_coordinator_round_members", status="ready") == 0
    assert value(samples, "cnode_coordinator_rounds", status="open") == 1
    assert value(samples, "cnode_coordinator_rounds", status="agreed") == 0
    assert value(samples, "cnode_coordinator_allowlist") == 3
    assert value(samples, "cnode_coordinator_checkpoint_round") == 0
    assert value(samples, "process_cpu_seconds_total") > 0
    # Nothing secret: no peer id, key or token appears on the page.
    page = httpx.get(f"{running.url}/metrics").text
    assert peers[0].peer_id_str not in page and running.peer_id not in page


def test_a_ban_shows_in_the_metrics(running: Running, peers: list[Identity]) -> None:
    running.admin().ban(peers[2].peer_id_str, "testing the metrics")
    samples = scrape(f"{running.url}/metrics")
    assert sum(v for _, v in samples["cnode_coordinator_bans"]) == 1
