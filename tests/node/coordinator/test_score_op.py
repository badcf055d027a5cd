"""Op `score` against a real coordinator over HTTP (specs/coordinator.md, "Scores in
partitioned rounds"): one record per member, the first stands, closed when all sent one or at
the score deadline; the round record lists them."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from cnode.node.coordinator import CoordinatorRejected, RoundInfo

from .conftest import run_config
from .test_partitions import _header, _publish


def _record(text: str) -> str:
    return _header(f"score record {text}")


def test_score_records_are_listed_and_closed_once_every_member_sent_one(
    serve: Any, peers: Any
) -> None:
    running = serve(run_config(peers, partitioned="auto", min_participants=4))

    async def main() -> None:
        clients, info = await _publish(running, peers)
        assert info.scores == {} and info.scores_closed is False
        payload = info.to_payload()
        assert "scores" not in payload and "scores_closed" not in payload  # old bytes kept
        members = sorted(clients)
        for peer in members[:3]:
            await clients[peer].score(1, record=_record(peer))
        first = clients[members[0]]
        await first.score(1, record=_record(members[0]))  # a resend: accepted, nothing changes
        with pytest.raises(CoordinatorRejected) as caught:
            await first.score(1, record=_record("another"))
        assert caught.value.code == "score_recorded"
        info = await first.round_info(1)
        assert info.scores == {p: _record(p) for p in members[:3]}
        assert info.scores_closed is False
        assert RoundInfo.from_payload(info.to_payload()) == info
        await clients[members[3]].score(1, record=_record(members[3]))
        info = await first.round_info(1)
        assert info.scores_closed is True and len(info.scores) == 4
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_score_records_close_at_the_score_deadline(serve: Any, peers: Any) -> None:
    # A 2 s collect window: the score deadline is 0.5 s before its end (a quarter of it, shorter
    # than SCORE_CLOSE_MARGIN_S).
    running = serve(
        run_config(peers, partitioned="auto", min_participants=4, collect_timeout_s=2.0)
    )

    async def main() -> None:
        clients, info = await _publish(running, peers)
        members = sorted(clients)
        await clients[members[0]].score(1, record=_record(members[0]))
        assert info.collect_deadline_ms is not None
        await trio.sleep(max(0.0, info.collect_deadline_ms / 1000 - time.time() - 0.4))
        info = await clients[members[0]].round_info(1)
        assert info.scores_closed is True and list(info.scores) == [members[0]]
        with pytest.raises(CoordinatorRejected) as caught:
            await clients[members[1]].score(1, record=_record(members[1]))
        assert caught.value.code == "scores_closed"
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_bad_score_requests_are_refused_naming_what_is_wrong(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers[:3], partitioned="never", min_participants=3))

    async def main() -> None:
        clients, _info = await _publish(running, peers[:3])
        c = next(iter(clients.values()))
        with pytest.raises(CoordinatorRejected) as caught:
            await c.score(1, record="not-a-cid")
        assert caught.value.code == "bad_cid" and "'record'" in caught.value.message
        with pytest.raises(CoordinatorRejected) as caught:
            await c.score(1, record=_record("x"))
        assert caught.value.code == "not_partitioned"
        with pytest.raises(CoordinatorRejected) as caught:
            await c.score(7, record=_record("x"))
        assert caught.value.code == "round_not_published"
        for client in clients.values():
            await client.aclose()

    trio.run(main)
