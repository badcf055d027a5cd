"""DISCO-style rounds (PR #775) against a real coordinator, driven by the async client (trio)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from cnode.auth import Identity
from cnode.node.coordinator import (
    CoordinatorClient,
    CoordinatorRejected,
    Phase,
    RoundStatus,
)
from cnode.storage import compute_cid

from .conftest import Running, run_config


def clients(running: Running, peers: list[Identity]) -> list[CoordinatorClient]:
    return [
        CoordinatorClient(
            running.url, run=running.server.run, coordinator=running.peer_id, identity=p
        )
        for p in peers
    ]


def run_trio(fn: Any, *args: Any) -> Any:
    return trio.run(fn, *args)


def test_round_closes_at_first_ready_and_late_joiner_goes_to_next(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=2))
    header = str(compute_cid(b"signed update header of b", 0x71))

    async def main() -> None:
        a, b, c, _ = clients(running, peers)
        for cl in (a, b, c):
            await cl.join()
        state = await a.run_state()
        assert state.phase is Phase.WAITING_FOR_MEMBERS
        assert await a.join_round() == 1
        state = await a.run_state()
        assert state.waiting == "round 1 has 1 of 2 participants"
        assert await b.join_round() == 1
        assert (await a.run_state()).phase is Phase.TRAINING
        await a.ready(1)  # first ready: list of round 1 closes
        info = await a.round_info(1)
        assert info.status is RoundStatus.CLOSED and info.joined == 2
        assert await c.join_round() == 2  # too late for round 1
        async with trio.open_nursery() as nursery:
            results: dict[str, Any] = {}

            async def wait(cl: CoordinatorClient, key: str) -> None:
                with trio.fail_after(10):
                    results[key] = await cl.wait_members(1)

            nursery.start_soon(wait, a, "a")
            await trio.sleep(0.2)
            await b.ready(1, header=header)
        members = results["a"].members
        assert results["a"].headers == {peers[1].peer_id_str: header}
        assert members == sorted([peers[0].peer_id_str, peers[1].peer_id_str])
        state = await c.run_state()
        assert state.round.round == 2 and state.round.joined == 1
        assert state.last_round is not None and state.last_round.members == members
        for cl in (a, b, c):
            await cl.aclose()

    run_trio(main)


def test_leaving_before_close_never_fails_the_round(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=2))

    async def main() -> None:
        a, b, c, _ = clients(running, peers)
        for cl in (a, b, c):
            await cl.join()
            await cl.join_round()
        await c.leave(1)  # before the list closes
        await a.ready(1)
        await b.ready(1)
        with trio.fail_after(10):
            info = await a.wait_members(1)
        assert c._core.identity.peer_id_str not in info.members and len(info.members) == 2
        for cl in (a, b, c):
            await cl.aclose()

    run_trio(main)


def test_vanished_member_dropped_at_deadline(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=2, round_timeout_s=0.5))

    async def main() -> None:
        a, b, c, _ = clients(running, peers)
        for cl in (a, b, c):
            await cl.join()
            await cl.join_round()
        await a.ready(1)
        await b.ready(1)  # c never says ready: it vanished
        with trio.fail_after(10):
            info = await a.wait_members(1)
        assert sorted(info.members) == sorted([peers[0].peer_id_str, peers[1].peer_id_str])
        with pytest.raises(CoordinatorRejected) as err:
            await c.ready(1)
        assert err.value.code == "round_over"
        for cl in (a, b, c):
            await cl.aclose()

    run_trio(main)


def test_below_min_participants_the_run_waits_and_says_so(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=3, round_timeout_s=0.5))

    async def main() -> None:
        a, b, c, d = clients(running, peers)
        for cl in (a, b, c, d):
            await cl.join()
        for cl in (a, b, c):
            await cl.join_round()
        await a.ready(1)
        await b.ready(1)  # c vanishes: at the deadline 2 < 3 remain
        with trio.fail_after(10):
            while (await a.run_state()).round.status is not RoundStatus.OPEN:
                await trio.sleep(0.1)
        state = await a.run_state()
        assert state.phase is Phase.WAITING_FOR_MEMBERS
        assert state.waiting == "round 1 has 2 of 3 participants"
        assert (await a.round_info(1)).status is RoundStatus.OPEN
        await d.join_round()  # the reopened round takes a new member
        await d.ready(1)
        with trio.fail_after(10):
            info = await a.wait_members(1)
        assert len(info.members) == 3
        for cl in (a, b, c, d):
            await cl.aclose()

    run_trio(main)


def test_checkpoints_epochs_and_cooldown(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=1, checkpoint_every=2, cooldown_s=30))
    cid, cid2 = str(compute_cid(b"checkpoint 2")), str(compute_cid(b"checkpoint 1"))

    async def main() -> None:
        (a,) = clients(running, peers[:1])
        await a.join()
        assert await a.current_checkpoint() is None
        for n in (1, 2):
            assert await a.join_round() == n
            await a.ready(n)
            with trio.fail_after(10):
                await a.wait_members(n)
        state = await a.run_state()
        assert state.phase is Phase.COOLDOWN and state.epoch == 0
        assert state.waiting == "cooldown: waiting for the checkpoint of round 2"
        record = await a.submit_checkpoint(
            epoch=0, round=2, manifest=cid, hf_repo="u/m", hf_revision="abc"
        )
        assert record.round == 2 and record.manifest == cid and record.hf_repo == "u/m"
        state = await a.run_state()
        assert state.epoch == 1 and state.phase is Phase.WAITING_FOR_MEMBERS  # round 3 is empty
        assert state.checkpoint == record
        with pytest.raises(CoordinatorRejected) as err:
            await a.submit_checkpoint(epoch=0, round=1, manifest=cid2)
        assert err.value.code == "stale_round" and err.value.status == 409
        with pytest.raises(CoordinatorRejected) as err:
            await a.submit_checkpoint(epoch=1, round=3, manifest=cid2)
        assert err.value.code == "round_not_published"
        assert (await a.current_checkpoint()) == record
        # The history is signed too, oldest first, paged by round.
        for n in (3, 4):
            assert await a.join_round() == n
            await a.ready(n)
            with trio.fail_after(10):
                await a.wait_members(n)
        record4 = await a.submit_checkpoint(epoch=1, round=4, manifest=cid2)
        assert await a.checkpoints() == [record, record4]
        assert await a.checkpoints(after=2) == [record4]
        assert await a.checkpoints(limit=1) == [record]
        await a.aclose()

    run_trio(main)
