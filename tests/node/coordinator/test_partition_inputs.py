"""Partitioned rounds, bad input: each is a 4xx with a clear message and nothing stored changes;
bad partitioned fields in a signed round record raise BadRunState; an old database migrates."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from cnode.auth import Identity
from cnode.node.coordinator import (
    BadRunState,
    CoordinatorClient,
    RoundInfo,
    RoundStatus,
    RunConfig,
    RunConfigError,
)
from cnode.storage import compute_cid

from .conftest import Running, body, post, refused, run_config

HEADER = str(compute_cid(b"a partition result header", 0x71))


def _publish(running: Running, members: list[Identity]) -> RoundInfo:
    async def main() -> RoundInfo:
        clients = [
            CoordinatorClient(
                running.url, run=running.server.run, coordinator=running.peer_id, identity=p
            )
            for p in members
        ]
        for c in clients:
            await c.join()
            await c.join_round()
        for c, p in zip(clients, members, strict=True):
            await c.ready(1, header=str(compute_cid(p.peer_id_str.encode(), 0x71)))
        with trio.fail_after(10):
            info = await clients[0].wait_members(1)
        for c in clients:
            await c.aclose()
        return info

    info: RoundInfo = trio.run(main)
    return info


def _token(running: Running, peer: Identity) -> bytes:
    with running.client(peer) as c:
        return c.join().token


def test_bad_result_and_checked_requests_change_nothing(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, partitioned="auto", min_participants=3))
    info = _publish(running, peers[:3])
    by_id = {p.peer_id_str: p for p in peers}
    agg = by_id[info.aggregators[0]]
    token = _token(running, agg)
    outsider = peers[3]  # allowlisted and joined the run, not a member of round 1
    outsider_token = _token(running, outsider)
    before = running.state()

    def result(args: dict[str, Any], who: Identity = agg, tok: bytes = token) -> Any:
        return post(running, "result", body(who, "result", args, token=tok))

    def checked(args: dict[str, Any]) -> Any:
        return post(running, "checked", body(agg, "checked", args, token=token))

    ok = {"round": 1, "partition": 0, "header": HEADER}
    refused(result(ok | {"partition": 3}), 400, "bad_request", "partition 3 is not below parts")
    refused(result(ok | {"partition": -1}), 400, "bad_request", "'partition' must be >= 0")
    refused(result(ok | {"partition": "0"}), 400, "bad_request", "'partition' must be int")
    refused(result(ok | {"partition": True}), 400, "bad_request", "'partition' must be int")
    refused(result(ok | {"header": "not-a-cid"}), 400, "bad_cid", "'header' is not a CID")
    refused(result({"round": 1, "partition": 0}), 400, "bad_request", "'header' must be str")
    refused(result(ok | {"round": 9}), 409, "round_not_published", "round 9")
    refused(result(ok, outsider, outsider_token), 409, "not_member", "not a member of round 1")
    refused(checked({"round": 1}), 400, "bad_request", "'wrong' must be a list")
    refused(checked({"round": 1, "wrong": ["0"]}), 400, "bad_request", "'wrong' must be a list")
    refused(checked({"round": 1, "wrong": [0, 0]}), 400, "bad_request", "distinct")
    refused(checked({"round": 1, "wrong": [-2]}), 400, "bad_request", "distinct partitions >= 0")
    refused(checked({"round": 1, "wrong": [3]}), 400, "bad_request", "partition 3, not below 3")
    refused(checked({"round": 1, "wrong": []}), 409, "results_pending", "have no result yet")
    refused(checked({"round": 2, "wrong": []}), 409, "round_not_published", "round 2")
    assert running.state() == before
    with sqlite3.connect(running.server.store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0
        assert (
            db.execute("SELECT COUNT(*) FROM members WHERE checked_at IS NOT NULL").fetchone()[0]
            == 0
        )


def _round_payload(**partitioned: Any) -> dict[str, Any]:
    info = RoundInfo("r", 1, 0, RoundStatus.PUBLISHED, ["a", "b", "c"], 3, 3, None)
    return info.to_payload() | partitioned


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"parts": "3", "aggregators": ["a", "b", "c"]}, "'parts' must be an integer"),
        ({"parts": True, "aggregators": ["a"]}, "'parts' must be an integer"),
        ({"parts": -1}, "'parts' must be in"),
        ({"parts": 3, "aggregators": ["a", "b"]}, "one peer id per partition"),
        ({"parts": 1, "aggregators": [7]}, "one peer id per partition"),
        ({"parts": 1, "aggregators": ["a"], "results": []}, "map partitions to results"),
        ({"parts": 1, "aggregators": ["a"], "results": {"00": {}}}, "not a decimal index"),
        ({"parts": 1, "aggregators": ["a"], "results": {"1": {}}}, "not below parts"),
        ({"parts": 1, "aggregators": ["a"], "results": {"0": "x"}}, "must be a map"),
        (
            {"parts": 1, "aggregators": ["a"], "results": {"0": {"peer": "a"}}},
            "needs peer and header",
        ),
        (
            {
                "parts": 1,
                "aggregators": ["a"],
                "results": {"0": {"peer": "a", "header": "h", "replaced": 5}},
            },
            "strings or null",
        ),
        (
            {"parts": 1, "aggregators": ["a"], "verify_deadline_ms": 1.5},
            "'verify_deadline_ms' must be an integer",
        ),
        (
            {"parts": 1, "aggregators": ["a"], "results_open_ms": 5},
            "'results_open_ms' and 'backup_step_ms' go together",
        ),
        (
            {"parts": 1, "aggregators": ["a"], "results_open_ms": 5, "backup_step_ms": "1"},
            "'backup_step_ms' must be an integer",
        ),
        (
            {"parts": 1, "aggregators": ["a"], "results_open_ms": 5, "backup_step_ms": 0},
            "'backup_step_ms' must be positive",
        ),
    ],
)
def test_bad_partitioned_fields_in_a_signed_round(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(BadRunState, match=words):
        RoundInfo.from_payload(_round_payload(**fields))


def _downgrade_to_schema_2(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE results")
        for table, column in (
            ("rounds", "parts"),
            ("rounds", "backup_steps"),
            ("rounds", "verify_deadline"),
            ("members", "checked"),
            ("members", "checked_at"),
        ):
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")


def test_a_schema_2_database_opens_migrated_and_runs_partitioned_rounds(
    serve: Any, peers: Any, tmp_path: Path
) -> None:
    db = tmp_path / "old.db"
    config = run_config(peers, partitioned="auto", min_participants=2)
    running = serve(config, db=db)
    old = _publish(running, peers[:2])  # two members: full replication, as schema 2 knew it
    assert old.parts == 0
    running.stop()
    _downgrade_to_schema_2(db)
    running = serve(config, db=db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("5",)
        cols = {r[1] for r in conn.execute("PRAGMA table_info(rounds)")}
        assert {"parts", "backup_steps", "verify_deadline"} <= cols
    state = running.state()
    assert state["last_round"]["members"] == old.members and "parts" not in state["last_round"]

    async def main() -> None:
        clients = [
            CoordinatorClient(
                running.url, run=running.server.run, coordinator=running.peer_id, identity=p
            )
            for p in peers[:3]
        ]
        for c in clients:
            await c.join()
            assert await c.join_round() == 2
        for c in clients:
            await c.ready(2, header=HEADER)
        with trio.fail_after(10):
            info = await clients[0].wait_members(2)
        assert info.parts == 3
        aggregator = clients[[p.peer_id_str for p in peers[:3]].index(info.aggregators[1])]
        await aggregator.result(2, partition=1, header=HEADER)
        assert (await clients[0].round_info(2)).results["1"].header == HEADER
        for c in clients:
            await c.aclose()

    trio.run(main)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"training": {"partitioned": "sometimes"}}, "training.partitioned must be one of"),
        ({"training": {"partitioned": True}}, "training.partitioned must be one of"),
        ({"rounds": {"backup_step_s": 0}}, "rounds.backup_step_s must be in"),
        ({"rounds": {"verify_timeout_s": -1.0}}, "rounds.verify_timeout_s must be in"),
        ({"rounds": {"verify_timeout_s": "60"}}, "verify_timeout_s must be float"),
        ({"rounds": {"late_max_s": 0}}, "rounds.late_max_s must be in"),
        ({"rounds": {"late_max_s": 1e9}}, "rounds.late_max_s must be in"),
        ({"training": {"scores": "yes"}}, "training.scores must be true or false"),
    ],
)
def test_bad_partitioned_settings_refuse_the_run_config(raw: dict[str, Any], words: str) -> None:
    with pytest.raises(RunConfigError, match=words):
        RunConfig.from_dict({"run": "r", **raw})


def test_partitioned_settings_default_and_load() -> None:
    config = RunConfig.from_dict({"run": "r"})
    assert config.partitioned == "auto"
    assert config.rounds.backup_step_s == 15.0 and config.rounds.verify_timeout_s == 60.0
    assert config.rounds.late_max_s == 60.0 and config.scored  # scores: on unless false
    assert "late_max_s" not in config.to_dict()["rounds"]  # the default keeps the run's bytes
    assert not RunConfig.from_dict({"run": "r", "training": {"scores": False}}).scored
    assert [config.partition_rounds(n) for n in (1, 2, 3, 64)] == [False, False, True, True]
    always = RunConfig.from_dict({"run": "r", "training": {"partitioned": "always"}})
    assert always.partition_rounds(1)
    never = RunConfig.from_dict({"run": "r", "training": {"partitioned": "never"}})
    assert not never.partition_rounds(100)
