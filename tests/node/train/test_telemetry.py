"""What a node reports to the dashboard: built from its own events, bounded, never NaN."""

from __future__ import annotations

import math

from cnode.node.coordinator import limits as coordinator_limits
from cnode.node.train.swarm._telemetry import catch_up_report, round_report


def test_a_round_report_carries_the_loss_and_the_held_checkpoint() -> None:
    report = round_report(3, 4.25, "bafystate", "bafymanifest")
    assert report == {
        "kind": "round", "round": 3, "loss": 4.25, "state": "bafystate", "holds": "bafymanifest"
    }  # fmt: skip
    assert "holds" not in (round_report(4, 4.0, "bafystate", None) or {})
    # DAG-CBOR has no NaN or infinity, and a diverged loss is no point on a chart anyway.
    assert round_report(5, math.nan, "bafystate", None) is None
    assert round_report(5, math.inf, "bafystate", None) is None


def test_a_catch_up_report_keeps_the_holders_that_served_most() -> None:
    many = coordinator_limits.MAX_REPORT_HOLDERS + 10
    caught = {
        "round": 2, "manifest": "bafymanifest", "seconds": 1.5, "source": "peers",
        "bytes": sum(range(many)), "bytes_per_holder": {f"peer{i}": i for i in range(many)},
        "fetch_seconds": 1.2, "dropped": {},
    }  # fmt: skip
    report = catch_up_report(caught)
    assert len(report["bytes_per_holder"]) == coordinator_limits.MAX_REPORT_HOLDERS
    assert (
        f"peer{many - 1}" in report["bytes_per_holder"]
        and "peer0" not in report["bytes_per_holder"]
    )
    assert (report["kind"], report["round"], report["source"]) == ("catch_up", 2, "peers")
    hub = catch_up_report({**caught, "source": "hub", "bytes_per_holder": {}})
    assert hub["source"] == "hub" and hub["bytes_per_holder"] == {}
