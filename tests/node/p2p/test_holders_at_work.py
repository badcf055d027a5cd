"""How many holders a fetch puts to work (node/p2p/_fetch/_scheduler.py, specs/blocks.md 12a):
as many as the work left needs, plus one hedge, the next named when those at work lack the head.
Against the in-memory fake holders of tests/node/p2p/fake_holders.py, under a MockClock, as
test_scheduler.py runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from cnode.node.p2p import limits
from cnode.node.p2p._fetch._scheduler import Transfer
from tests.node.p2p.fake_holders import CountingStore, FakeHolder, blocks_of, opener
from tests.node.p2p.test_scheduler import _assert_fetched_once, _holders, _run

pytestmark = pytest.mark.usefixtures("threads_inline")


class _Spawned(trio.abc.Instrument):
    def __init__(self) -> None:
        self.tasks = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.tasks += 1


def test_a_one_block_fetch_from_32_holders_runs_the_workers_of_two(tmp_path: Path) -> None:
    """Issue 41: a result asked of its aggregator, then of every member, ran the workers of all
    32 holders, each woken at every change of the fetch. Now the first holder named and one
    more (the end game's hedge) are at work; the block comes from the first, asked once."""
    blocks = blocks_of(1)
    holders = list(_holders(blocks, 32, block_s=0.1))
    spawned = _Spawned()
    store = CountingStore(tmp_path / "store")

    async def main() -> None:
        trio.lowlevel.add_instrument(spawned)
        transfer = Transfer(store, opener(holders), [h.peer for h in holders])
        with trio.fail_after(3600):
            await transfer.fetch(list(blocks))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert set(store.iter_cids()) == set(blocks)
    assert [h.peer for h in holders if h.requests] == ["peer-0"]
    at_work = 1 + limits.HEDGE_HOLDERS
    # Its workers, the rate watch and its nursery's tasks; the fake holders' own tasks.
    assert spawned.tasks <= at_work * limits.MAX_IN_FLIGHT_PER_HOLDER + 8, spawned.tasks


def test_when_every_holder_at_work_lacks_a_block_the_next_one_named_is_asked(
    tmp_path: Path,
) -> None:
    """Holders are put to work in the order named: ten that lack the block each answer
    LACKING once, the eleventh sends it, and the twelfth is never asked."""
    blocks = blocks_of(1)
    cids = list(blocks)
    lacking = [FakeHolder(f"empty-{i}", blocks, lacks=set(cids)) for i in range(10)]
    full = [FakeHolder(f"full-{i}", blocks, block_s=0.1) for i in range(2)]
    holders = lacking + full
    out = _run(tmp_path, holders, cids)
    _assert_fetched_once(out, holders, cids)
    assert [len(h.requests) for h in holders] == [1] * 10 + [1, 0]
    assert out.report.dropped == {}


def test_a_large_fetch_still_puts_every_holder_it_needs_to_work(tmp_path: Path) -> None:
    """What is left, in MIN_SPLIT_BYTES per worker, decides how many are at work: 96 blocks
    of unknown size (each counted as MAX_BLOCK_SIZE) are spread over all six holders."""
    blocks = blocks_of(96)
    cids = list(blocks)
    holders = list(_holders(blocks, 6, block_s=0.1))
    out = _run(tmp_path, holders, cids)
    _assert_fetched_once(out, holders, cids)
    assert all(h.sent for h in holders), [len(h.sent) for h in holders]
