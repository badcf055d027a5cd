"""Partitioned rounds against a real coordinator over HTTP (specs/coordinator.md, "Partitioned
rounds"): publishing with aggregators, results from aggregators and backups, `checked`,
deadlines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from cnode.aggregation import assign_partitions, backup_aggregators, partition_count
from cnode.aggregation.limits import SEGMENTS
from cnode.auth import Identity
from cnode.node.coordinator import (
    CoordinatorClient,
    CoordinatorRejected,
    PartitionResultEntry,
    RoundInfo,
    RoundStatus,
    limits,
)
from cnode.storage import compute_cid
from tests.support.browser import open_page

from .conftest import Running, run_config


def _client(running: Running, peer: Identity) -> CoordinatorClient:
    return CoordinatorClient(
        running.url, run=running.server.run, coordinator=running.peer_id, identity=peer
    )


def _header(text: str) -> str:
    return str(compute_cid(text.encode(), 0x71))


async def _publish(
    running: Running, members: list[Identity], n: int = 1
) -> tuple[dict[str, CoordinatorClient], RoundInfo]:
    """Every member joins round ``n`` and says ready; return clients by peer id and the record."""
    clients = {p.peer_id_str: _client(running, p) for p in members}
    for c in clients.values():
        await c.join()
        assert await c.join_round() == n
    for peer, c in clients.items():
        await c.ready(n, header=_header(f"update of {peer}"))
    with trio.fail_after(10):
        info = await next(iter(clients.values())).wait_members(n)
    return clients, info


async def _rejected(call: Any, code: str, words: str) -> CoordinatorRejected:
    with pytest.raises(CoordinatorRejected) as caught:
        await call
    assert caught.value.code == code, caught.value
    assert words in caught.value.message, caught.value
    return caught.value


def test_a_partitioned_round_is_published_with_its_aggregators(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, partitioned="auto", min_participants=4))

    async def main() -> None:
        clients, info = await _publish(running, peers)
        members = sorted(clients)
        assert info.status is RoundStatus.PUBLISHED and info.members == members
        assert info.parts == partition_count(4, SEGMENTS) == 4
        assert info.aggregators == assign_partitions("test-run", 1, members, 4)
        assert info.results == {} and info.verify_deadline_ms is None
        assert RoundInfo.from_payload(info.to_payload()) == info
        for c in clients.values():
            await c.aclose()

    trio.run(main)


@pytest.mark.parametrize(
    ("mode", "size", "parts"),
    [("auto", 2, 0), ("auto", 3, 3), ("always", 1, 1), ("never", 4, 0)],
)
def test_which_rounds_are_partitioned(
    serve: Any, peers: Any, mode: str, size: int, parts: int
) -> None:
    running = serve(run_config(peers, partitioned=mode, min_participants=size))

    async def main() -> None:
        clients, info = await _publish(running, peers[:size])
        assert info.parts == parts
        assert len(info.aggregators) == parts
        if parts == 0:  # a full-replication record keeps its old bytes: no partitioned keys
            assert "parts" not in info.to_payload() and "results" not in info.to_payload()
            c = next(iter(clients.values()))
            await _rejected(
                c.result(1, partition=0, header=_header("r")), "not_partitioned", "round 1"
            )
            with trio.fail_after(5):
                assert (await c.wait_results(1)).status is RoundStatus.PUBLISHED
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_results_from_aggregators_and_who_may_not_submit(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, partitioned="auto", min_participants=3))

    async def main() -> None:
        clients, info = await _publish(running, peers[:3])
        agg = info.aggregators
        first, other = _header("result 0"), _header("another result 0")
        # A member that does not aggregate partition 0 is refused, and told who may and when.
        e = await _rejected(
            clients[agg[1]].result(1, partition=0, header=first), "not_your_partition", agg[0]
        )
        assert "one step after the result window opens" in e.message
        await clients[agg[0]].result(1, partition=0, header=first)
        await clients[agg[0]].result(1, partition=0, header=first)  # a resend: the same answer
        # Another header for a recorded partition: refused, naming the one that stands.
        await _rejected(
            clients[agg[0]].result(1, partition=0, header=other), "result_recorded", first
        )
        await _rejected(clients[agg[1]].collected(1, missing=[]), "partitioned_round", "`checked`")
        record = await clients[agg[2]].round_info(1)
        assert record.results == {"0": PartitionResultEntry(agg[0], first, None, None)}
        assert record.status is RoundStatus.PUBLISHED and record.excluded == {}
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_a_backup_takes_a_silent_partition_over_at_its_time(serve: Any, peers: Any) -> None:
    running = serve(
        run_config(
            peers, partitioned="auto", min_participants=3, collect_timeout_s=1.0, backup_step_s=1.0
        )
    )

    async def main() -> None:
        clients, info = await _publish(running, peers[:3])
        members, agg = info.members, info.aggregators
        b0, b1 = backup_aggregators("test-run", 1, members, 2)[:2]
        header = _header("backup result 2")
        await _rejected(clients[b0].result(1, partition=2, header=header), "not_your_partition", b0)
        # At the collect deadline the result window opens (no scores in this run); its step is
        # backup_step_s (nothing measured a slower swarm). The aggregator has the first step.
        with trio.fail_after(10):
            while (record := await clients[b0].round_info(1)).results_open_ms is None:
                await trio.sleep(0.05)
        assert record.backup_step_ms == 1000
        assert info.collect_deadline_ms is not None
        assert record.results_open_ms >= info.collect_deadline_ms
        await _rejected(clients[b0].result(1, partition=2, header=header), "not_your_partition", b0)
        await trio.sleep(max(0.0, record.results_open_ms / 1000 + 1.0 - time.time()) + 0.05)
        # The first backup's time has come; the second's is one step later.
        await _rejected(clients[b1].result(1, partition=2, header=header), "not_your_partition", b1)
        await clients[b0].result(1, partition=2, header=header)
        await _rejected(
            clients[agg[2]].result(1, partition=2, header=_header("late")),
            "result_recorded",
            header,
        )
        record = await clients[b0].round_info(1)
        assert record.results["2"] == PartitionResultEntry(b0, header, None, None)
        assert record.excluded == {
            agg[2]: f"partition 2: no result by the deadline; aggregated by backup {b0}"
        }
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_checked_by_every_member_agrees_the_round(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, partitioned="auto", min_participants=3))

    async def main() -> None:
        clients, info = await _publish(running, peers[:3])
        agg = info.aggregators
        for p in (0, 1):
            await clients[agg[p]].result(1, partition=p, header=_header(f"result {p}"))
        await _rejected(clients[agg[0]].checked(1, wrong=[]), "results_pending", "[2]")
        async with trio.open_nursery() as nursery:
            got: list[RoundInfo] = []

            async def wait() -> None:
                with trio.fail_after(10):
                    got.append(await clients[agg[1]].wait_results(1))

            nursery.start_soon(wait)
            await trio.sleep(0.2)
            assert not got
            await clients[agg[2]].result(1, partition=2, header=_header("result 2"))
        assert sorted(got[0].results) == ["0", "1", "2"]
        assert got[0].verify_deadline_ms is not None and got[0].status is RoundStatus.PUBLISHED
        for c in clients.values():
            assert (await c.round_info(1)).status is RoundStatus.PUBLISHED
            await c.checked(1, wrong=[])
        with trio.fail_after(10):
            agreed = await clients[agg[0]].wait_agreed(1)
        assert agreed.agreed == sorted(clients) and agreed.excluded == {}
        assert agreed.parts == 3 and len(agreed.results) == 3
        before = running.state()["version"]
        await clients[agg[0]].checked(1, wrong=[1])  # after the decision: accepted, no change
        assert running.state()["version"] == before
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_the_verify_deadline_agrees_without_the_silent(serve: Any, peers: Any) -> None:
    # One `checked` of three, no majority: agreed late_max_s past the verify deadline.
    running = serve(
        run_config(
            peers, partitioned="auto", min_participants=3, verify_timeout_s=0.5, late_max_s=0.5
        )
    )

    async def main() -> None:
        clients, info = await _publish(running, peers[:3])
        for p, peer in enumerate(info.aggregators):
            await clients[peer].result(1, partition=p, header=_header(f"result {p}"))
        await clients[info.aggregators[0]].checked(1, wrong=[])
        with trio.fail_after(10):
            agreed = await clients[info.aggregators[0]].wait_agreed(1)
        assert agreed.verify_deadline_ms is not None
        assert time.time() * 1000 >= agreed.verify_deadline_ms
        assert agreed.agreed == info.members and agreed.excluded == {}
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_partitions_without_any_result_keep_the_parent_after_the_backups(
    serve: Any, peers: Any
) -> None:
    step = 0.2
    running = serve(
        run_config(
            peers, partitioned="auto", min_participants=3, collect_timeout_s=0.3, backup_step_s=step
        )
    )

    async def main() -> None:
        clients, info = await _publish(running, peers[:3])
        c = clients[info.members[0]]
        with trio.fail_after(10):
            agreed = await c.wait_agreed(1)
        assert info.collect_deadline_ms is not None and agreed.results_open_ms is not None
        assert agreed.results_open_ms >= info.collect_deadline_ms and agreed.backup_step_ms == 200
        # The aggregator's step, then one per backup.
        window = agreed.results_open_ms + (limits.MAX_PARTITION_BACKUPS + 1) * step * 1000
        assert time.time() * 1000 >= window - 1
        assert agreed.results == {} and agreed.agreed == info.members
        assert agreed.excluded == {
            peer: f"partition {p}: no result by the deadline nor from "
            f"{limits.MAX_PARTITION_BACKUPS} backups; it keeps the parent state"
            for p, peer in enumerate(info.aggregators)
        }
        await _rejected(
            clients[info.aggregators[0]].result(1, partition=0, header=_header("late")),
            "round_over",
            "agreed",
        )
        # The backup steps are in the change log, one per step, naming the backup due.
        with running.admin() as admin:
            steps = [e for e in admin.log() if e["kind"] == "partition_backups_due"]
        assert [e["detail"]["step"] for e in steps] == list(range(limits.MAX_PARTITION_BACKUPS))
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_the_dashboard_shows_each_partition_its_aggregator_and_result(
    serve: Any, peers: Any, tmp_path: Path
) -> None:
    running = serve(run_config(peers, partitioned="auto", min_participants=3))

    async def main() -> RoundInfo:
        clients, info = await _publish(running, peers[:3])
        await clients[info.aggregators[1]].result(1, partition=1, header=_header("result 1"))
        for c in clients.values():
            await c.aclose()
        return info

    info = trio.run(main)
    answer = httpx.get(f"{running.url}/v1/runs/test-run/dashboard")
    assert answer.status_code == 200, answer.text
    shown = next(r for r in answer.json()["rounds"] if r["round"] == 1)
    assert shown["parts"] == 3
    assert [p["aggregator"] for p in shown["partitions"]] == info.aggregators
    assert [p["result"] is None for p in shown["partitions"]] == [True, False, True]
    result = shown["partitions"][1]["result"]
    assert result["peer"] == info.aggregators[1] and result["header"] == _header("result 1")
    assert result["replaced"] is None and result["by"] is None
    full = next(r for r in answer.json()["rounds"] if r["round"] == 2)
    assert full["parts"] == 0 and full["partitions"] == []
    with open_page(tmp_path / "profile") as page:
        page.navigate(f"{running.url}/")
        page.wait_for(
            "document.querySelectorAll('details.partitions tr.partition').length === 3",
            30,
            "the partitions of round 1",
        )
        rows = page.evaluate(
            "[...document.querySelectorAll('details.partitions tr.partition')]"
            ".map(e => e.textContent)"
        )
        assert "no result" in rows[0] and "no result" not in rows[1]
        assert _header("result 1") in rows[1]
