"""A node's ``/metrics``: its report events and its traffic, served and scraped over HTTP.

The real node serves these in tests/node/train/test_swarm.py (``--metrics``); here the same
classes are driven by events of the shapes the round loop writes, to check every series.
"""

from __future__ import annotations

import httpx
import pytest

from cnode.node.p2p import FetchReport, Traffic
from cnode.node.p2p import limits as p2p_limits
from cnode.node.train import TrainingConfigError
from cnode.node.train._report import Event, Reporter
from cnode.node.train.swarm._metrics import NodeMetrics, serve_metrics
from cnode.storage import compute_cid
from tests.support.metrics import scrape, value


def _fetch(per_holder: dict[str, int], seconds: float) -> FetchReport:
    total = sum(per_holder.values())
    return FetchReport(compute_cid(b"root"), 3, total, seconds, per_holder, {})


def test_report_events_and_traffic_become_series() -> None:
    traffic = Traffic()
    metrics = NodeMetrics(traffic)
    reporter = Reporter(None, peer="me")
    reporter.observers.append(metrics)
    reporter.event(
        Event.ROUND,
        round=3,
        loss=4.5,
        state_cid="bafy",
        manifest=None,
        members=["p1", "p2", "p3"],
        dropped={"p4": "its update could not be fetched"},
        local_loss=[5.0, 4.0],
        train_s=1.5,
        publish_s=0.25,
        fetch_s=2.0,
        aggregate_s=0.5,
        parts=3,
        bytes_in=1000,
        bytes_out=2000,
    )
    reporter.event(Event.BAN_SEEN, peers=["p4"], via="gossip")
    reporter.event(Event.BAN_SEEN, peers=["p4"], via="poll")  # the same ban seen twice counts once
    traffic.fetched(_fetch({"holder-a": 3_000_000, "holder-b": 1_000_000}, 2.0))
    traffic.served("p2", 500)
    traffic.exchange.request_done(0.1, 0.01, 0.2, 4000, "segments/chunks", 20)
    traffic.exchange.request_done(0.1, 0.01, 0.2, 900, "segments/root", 1)
    traffic.exchange.request_done(0.1, 0.01, 0.2, 900, "segments/root", 1)

    with serve_metrics(("127.0.0.1", 0), metrics.registry) as url:
        samples = scrape(url)

    assert value(samples, "cnode_node_rounds_total") == 1
    assert value(samples, "cnode_node_round") == 3
    assert value(samples, "cnode_node_heldout_loss") == 4.5
    assert value(samples, "cnode_node_round_members") == 3
    assert value(samples, "cnode_node_phase_seconds_sum", phase="fetch") == 2.0
    assert value(samples, "cnode_node_phase_seconds_count", phase="train") == 1
    assert value(samples, "cnode_node_round_bytes_total", direction="in") == 1000
    assert value(samples, "cnode_node_updates_left_out_total", peer="p4") == 1
    assert value(samples, "cnode_node_bans_seen") == 1
    assert value(samples, "cnode_node_bytes_in_total", peer="holder-a") == 3_000_000
    assert value(samples, "cnode_node_fetch_rate_bytes_per_second", peer="holder-b") == 500_000
    assert value(samples, "cnode_node_bytes_out_total", peer="p2") == 500
    assert value(samples, "cnode_node_exchange_requests_total") == 3
    requests = "cnode_node_exchange_requests_by_purpose_total"
    assert value(samples, requests, purpose="segments", level="root") == 2
    assert value(samples, requests, purpose="segments", level="chunks") == 1
    # The server is gone once the block ends: nothing is left listening.
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=2)


def test_peer_ids_from_the_network_cannot_grow_the_tables_without_bound() -> None:
    traffic = Traffic()
    for i in range(p2p_limits.MAX_TRAFFIC_PEERS + 50):
        traffic.served(f"peer-{i}", 1)
        traffic.fetched(_fetch({f"holder-{i}": 10}, 1.0))
    assert len(traffic.bytes_out) == p2p_limits.MAX_TRAFFIC_PEERS + 1  # + "other"
    assert traffic.bytes_out["other"] == 50
    assert len(traffic.bytes_in) == p2p_limits.MAX_TRAFFIC_PEERS + 1


def test_a_taken_port_is_a_clear_error() -> None:
    metrics = NodeMetrics()
    with serve_metrics(("127.0.0.1", 0), metrics.registry) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with (
            pytest.raises(TrainingConfigError, match=f"--metrics 127.0.0.1:{port}: cannot listen"),
            serve_metrics(("127.0.0.1", port), metrics.registry),
        ):
            pass
