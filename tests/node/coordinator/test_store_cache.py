"""The facts the store keeps across requests (``_store/_cache.py``) equal what a fresh read of
the database gives, after every kind of write and after a refused request rolls back (issue 40).

The run is driven through the real driver and rules on a real SQLite file, without HTTP: joins,
readies, a published partitioned round, results, `checked` reports, a ban, an unban, a
checkpoint, and refusals in between."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cnode.node.coordinator import AccessConfig, RoundsConfig, RunConfig
from cnode.node.coordinator._exceptions import RequestRefused
from cnode.node.coordinator._http._driver import RunDriver
from cnode.node.coordinator._store._store import Store
from cnode.node.coordinator._wire._admin import BanPeer, UnbanPeer
from cnode.node.coordinator._wire._protocol import CheckpointRecord, RoundStatus

PEERS = [f"peer-{c}" for c in "abcd"]


def _fresh(path: Path, rounds: list[int]) -> object:
    other = Store(path)
    try:
        return other.facts(*rounds)
    finally:
        other.close()


def _same(store: Store, path: Path) -> None:
    n = store.run_row().round
    wanted = [n - 1, n, n + 1]
    assert store.facts(*wanted) == _fresh(path, wanted)


def test_kept_facts_equal_a_fresh_read(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    config = RunConfig(
        run="cache-run",
        rounds=RoundsConfig(min_participants=3, round_timeout_s=30.0),
        access=AccessConfig(peers=PEERS),
        training={"partitioned": "auto", "scores": False},
    )
    store = Store(path)
    config = store.initialize(config, "coord", time.time())
    driver = RunDriver(store, config, "coord")
    now = time.time()

    def op(call: object, *args: object) -> None:
        with store.tx():
            call(*args)  # type: ignore[operator]
        _same(store, path)

    for peer in PEERS[:3]:
        op(driver.join_round, peer, "", now)
    op(driver.ready, PEERS[0], 1, now, "bafy-h0")
    # A refusal after a write in the same transaction: rolled back, and so is what was kept.
    with pytest.raises(RequestRefused), store.tx():
        driver.ready(PEERS[1], 1, now, "bafy-h1")
        driver.ready(PEERS[3], 1, now, "bafy-h3")  # not a member: refused
    _same(store, path)
    assert store.round_facts(1).members[PEERS[1]].header is None
    for i, peer in enumerate(PEERS[1:3], start=1):
        op(driver.ready, peer, 1, now, f"bafy-h{i}")
    info = store.round_facts(1).row
    assert info is not None and info.status is RoundStatus.PUBLISHED and info.parts == 3
    op(driver.join_round, PEERS[3], "", now)  # into round 2
    aggregators = driver.partitions.aggregators(info)
    for p, peer in enumerate(aggregators):
        op(driver.result, peer, 1, p, f"bafy-r{p}", now)
    op(driver.admin, BanPeer(PEERS[2], "test ban"), "coord", now)
    for peer in PEERS[:2]:
        op(driver.checked, peer, 1, [], now)
    assert store.round_facts(1).row.status is RoundStatus.AGREED  # type: ignore[union-attr]
    assert PEERS[2] in store.round_facts(1).banned
    op(driver.admin, UnbanPeer(PEERS[2]), "coord", now)
    assert PEERS[2] not in store.round_facts(1).banned
    op(
        driver.submit_checkpoint,
        PEERS[0],
        CheckpointRecord(0, 1, "bafy-m1", None, None, PEERS[0], 0),
        now,
    )
    assert store.facts().latest_checkpoint is not None
    store.close()
