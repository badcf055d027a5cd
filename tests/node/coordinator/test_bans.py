"""Bans: by an admin (CLI) and by a majority of a round's members; revocation is immediate."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import tomli_w
import trio

from cnode.auth import Identity, save_identity
from cnode.node.cli import main
from cnode.node.coordinator import BanKind, CoordinatorClient, CoordinatorRejected
from cnode.storage import compute_cid

from .conftest import Running, body, post, refused, run_config


def clients(running: Running, peers: list[Identity]) -> list[CoordinatorClient]:
    return [
        CoordinatorClient(running.url, run="test-run", coordinator=running.peer_id, identity=p)
        for p in peers
    ]


def test_majority_of_round_members_bans_with_same_evidence(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=4))
    bad = peers[3].peer_id_str
    update = str(compute_cid(b"the bad update"))
    evidence = {
        "peer": bad,
        "round": 1,
        "kind": "outlier",
        "reason": "outlier in 3 of the last 5 rounds",
        "update_cid": update,
        "figures": {"distance": 12.5},
    }

    async def main_() -> None:
        a, b, c, d = cls = clients(running, peers)
        for cl in cls:
            await cl.join()
            await cl.join_round()
        for cl in cls:
            await cl.ready(1)
        with trio.fail_after(10):
            await a.wait_members(1)
        first = await a.report_ban_evidence(evidence)
        assert (first.reports, first.needed, first.banned) == (1, 2, False)
        other = await b.report_ban_evidence(evidence | {"kind": "rejected"})
        assert (other.reports, other.banned) == (1, False)  # different evidence does not add up
        with pytest.raises(CoordinatorRejected) as err:
            await d.report_ban_evidence(evidence | {"peer": peers[0].peer_id_str, "round": 2})
        assert err.value.code == "not_member"
        second = await c.report_ban_evidence(evidence)
        assert (second.reports, second.banned) == (2, True)
        state = await a.run_state()
        ban = state.banned(bad)
        assert ban is not None and ban.reason == evidence["reason"] and ban.round == 1
        assert (ban.kind, ban.by) == (BanKind.MAJORITY, peers[2].peer_id_str)  # c completed it
        with pytest.raises(CoordinatorRejected) as err:
            await d.join_round()  # its token is refused at once
        assert err.value.code == "banned" and "outlier" in err.value.message
        for cl in cls:
            await cl.aclose()

    trio.run(main_)


@pytest.fixture
def cli_logging() -> Iterator[None]:
    """The CLI configures structlog to print to the (captured) stderr; undo that afterwards."""
    try:
        yield
    finally:
        structlog.reset_defaults()


@pytest.fixture
def cli_files(tmp_path: Path, coordinator_key: Identity) -> tuple[Path, Path]:
    key = tmp_path / "coordinator.key"
    save_identity(coordinator_key, key)
    return tmp_path / "run.toml", key


def write_run_config(running: Running, path: Path) -> None:
    path.write_text(tomli_w.dumps(running.server.config.to_dict() | {"url": running.url}))


def test_cli_admin_commands_and_status(
    serve: Any, peers: Any, cli_files: Any, capsys: Any, cli_logging: None
) -> None:
    running = serve(run_config(peers[:1], min_participants=2))
    run_toml, key = cli_files
    write_run_config(running, run_toml)
    common = ["--run-config", str(run_toml), "--key", str(key)]
    newcomer = Identity.generate()

    assert main(["allowlist", "add", "alice", *common]) == 0
    assert main(["allowlist", "add", newcomer.peer_id_str, *common]) == 0
    assert main(["allowlist", "ls", *common]) == 0
    out = capsys.readouterr().out
    assert "user alice: added" in out and f"peer  {newcomer.peer_id_str}" in out
    with running.client(newcomer) as c:
        token = c.join().token
    assert main(["ban", newcomer.peer_id_str, "--reason", "spam in round 3", *common]) == 0
    # Revoked at once: the token it holds is refused, and it cannot join again.
    refused(
        post(running, "join_round", body(newcomer, "join_round", token=token)),
        403,
        "banned",
        "spam in round 3",
    )
    with running.client(newcomer) as c, pytest.raises(CoordinatorRejected) as err:
        c.join()
    assert err.value.code == "banned"
    capsys.readouterr()
    assert main(["status", "--run-config", str(run_toml)]) == 0
    out = capsys.readouterr().out
    assert "signature ok" in out and "phase WaitingForMembers" in out
    assert f"{newcomer.peer_id_str}: spam in round 3  [admin: an admin (peer …" in out
    assert main(["unban", newcomer.peer_id_str, *common]) == 0
    assert main(["allowlist", "remove", "alice", *common]) == 0
    assert "user alice: removed" in capsys.readouterr().out
    # A key that is not an admin's: refused, one clear line, exit 1.
    stranger = run_toml.parent / "stranger.key"
    save_identity(Identity.generate(), stranger)
    code = main(
        [
            "ban",
            newcomer.peer_id_str,
            "--reason",
            "x",
            "--run-config",
            str(run_toml),
            "--key",
            str(stranger),
        ]
    )
    assert code == 1
    assert "not_admin" in capsys.readouterr().err


# The coordinator's tables as schema 3 made them (before ban kinds), written out here rather
# than by old code: what a database of a coordinator of that version holds.
_SCHEMA_3 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE run (id INTEGER PRIMARY KEY CHECK (id = 1), phase TEXT NOT NULL, phase_until REAL,
    epoch INTEGER NOT NULL, round INTEGER NOT NULL, waiting TEXT);
CREATE TABLE rounds (round INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, status TEXT NOT NULL,
    opened_at REAL, closed_at REAL, deadline REAL, published_at REAL, members TEXT,
    collect_deadline REAL, agreed_at REAL, agreed TEXT, excluded TEXT, parts INTEGER,
    backup_steps INTEGER, verify_deadline REAL);
CREATE TABLE members (round INTEGER NOT NULL, peer TEXT NOT NULL, username TEXT NOT NULL,
    status TEXT NOT NULL, joined_at REAL NOT NULL, ready_at REAL, header TEXT, missing TEXT,
    collected_at REAL, checked TEXT, checked_at REAL, score_record TEXT, scored_at REAL,
    score_bytes BLOB, PRIMARY KEY (round, peer));
CREATE TABLE peers (peer TEXT PRIMARY KEY, username TEXT NOT NULL, joined_at REAL NOT NULL,
    token_expires REAL, addrs TEXT);
CREATE TABLE checkpoints (round INTEGER PRIMARY KEY, epoch INTEGER NOT NULL,
    manifest TEXT NOT NULL, hf_repo TEXT, hf_revision TEXT, submitter TEXT NOT NULL,
    at REAL NOT NULL);
CREATE TABLE allowlist (kind TEXT NOT NULL, value TEXT NOT NULL, added_by TEXT NOT NULL,
    at REAL NOT NULL, PRIMARY KEY (kind, value));
CREATE TABLE bans (peer TEXT PRIMARY KEY, username TEXT NOT NULL, reason TEXT NOT NULL,
    round INTEGER, evidence TEXT, by TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE ban_reports (round INTEGER NOT NULL, accused TEXT NOT NULL,
    reporter TEXT NOT NULL, reason TEXT NOT NULL, update_cid TEXT, figures TEXT,
    at REAL NOT NULL, PRIMARY KEY (round, accused, reporter));
CREATE TABLE results (round INTEGER NOT NULL, partition INTEGER NOT NULL, peer TEXT NOT NULL,
    header TEXT NOT NULL, replaced TEXT, by TEXT, at REAL NOT NULL,
    PRIMARY KEY (round, partition));
CREATE TABLE counters (peer TEXT PRIMARY KEY, last INTEGER NOT NULL);
CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL,
    actor TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
"""


def test_a_schema_3_database_keeps_its_bans_with_their_kinds(
    serve: Any, peers: Any, coordinator_key: Identity, tmp_path: Path
) -> None:
    config = replace(run_config(peers), coordinator=coordinator_key.peer_id_str)
    admin, reporter, verifier = (Identity.generate().peer_id_str for _ in range(3))
    banned = [Identity.generate().peer_id_str for _ in range(4)]
    db = tmp_path / "schema3.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(_SCHEMA_3)
        conn.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [
                ("schema", "3"),
                ("config", json.dumps(config.to_dict(), sort_keys=True)),
                ("coordinator", coordinator_key.peer_id_str),
            ],
        )
        conn.execute("INSERT INTO run VALUES (1, 'WaitingForMembers', NULL, 0, 2, NULL)")
        conn.execute(
            "INSERT INTO rounds (round, epoch, status, opened_at) VALUES (2, 0, 'open', 1)"
        )
        for peer in peers:
            conn.execute(
                "INSERT INTO allowlist VALUES ('peer', ?, 'config', 1)", (peer.peer_id_str,)
            )
        old_by = [
            f"admin:{admin}",
            "majority:2 of 3",
            f"checked:{reporter}",
            f"evidence:{verifier}",
        ]
        for i, (peer, by) in enumerate(zip(banned, old_by, strict=True)):
            conn.execute(
                "INSERT INTO bans VALUES (?, '', ?, 1, NULL, ?, ?)", (peer, f"reason {i}", by, i)
            )
        conn.execute(
            "INSERT INTO ban_reports VALUES (1, ?, ?, 'outlier in 3 of the last 5 rounds', NULL, "
            "'{}', 1)",
            (banned[1], reporter),
        )
    running = serve(config, db=db)
    bans = running.state()["bans"]
    assert [(b["peer"], b["kind"], b["by"]) for b in bans] == [
        (banned[0], "admin", admin),
        (banned[1], "majority", ""),  # schema 3 named no peer for a majority
        (banned[2], "checked", reporter),
        (banned[3], "partition", verifier),
    ]
    with sqlite3.connect(db) as conn:
        schema = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        assert schema == ("5",)  # migrated to the newest schema (5: result windows)
        # A report stored before carries no kind: it adds to no decision made from now on.
        assert conn.execute("SELECT kind FROM ban_reports").fetchall() == [(None,)]
    with running.client(Identity.generate()) as c:
        assert [b.decided_by() for b in c.run_state().bans][1:3] == [
            "a majority of the round's other members",
            f"checked by the coordinator (report of …{reporter[-8:]})",
        ]
    shown = httpx.get(f"{running.url}/v1/runs/test-run/dashboard").json()["bans"]
    assert sorted(b["kind"] for b in shown) == ["admin", "checked", "majority", "partition"]
    running.stop()
    assert [b["kind"] for b in serve(config, db=db).state()["bans"]] == [
        "admin",
        "majority",
        "checked",
        "partition",
    ]  # opened again: nothing changes


def test_ban_evidence_without_a_known_kind_is_refused(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=4))
    evidence = {"peer": peers[3].peer_id_str, "round": 1, "reason": "x", "update_cid": None}
    for bad in ({}, {"kind": "outlier in 3 of the last 5 rounds"}, {"kind": 3}):
        with running.client(peers[0]) as c:
            token = c.join().token
        request = body(peers[0], "ban_evidence", evidence | bad, token=token)
        answer = post(running, "ban_evidence", request)
        refused(answer, 400, "bad_request", "kind")
