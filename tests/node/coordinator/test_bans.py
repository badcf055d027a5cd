"""Bans: by an admin (CLI) and by a majority of a round's members; revocation is immediate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import tomli_w
import trio

from cnode.auth import Identity, save_identity
from cnode.node.cli import main
from cnode.node.coordinator import CoordinatorClient, CoordinatorRejected
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
        other = await b.report_ban_evidence(evidence | {"reason": "rejected: nan"})
        assert (other.reports, other.banned) == (1, False)  # different evidence does not add up
        with pytest.raises(CoordinatorRejected) as err:
            await d.report_ban_evidence(evidence | {"peer": peers[0].peer_id_str, "round": 2})
        assert err.value.code == "not_member"
        second = await c.report_ban_evidence(evidence)
        assert (second.reports, second.banned) == (2, True)
        state = await a.run_state()
        ban = state.banned(bad)
        assert ban is not None and ban.reason == evidence["reason"] and ban.round == 1
        assert ban.by == "majority:2 of 3"
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
    assert f"{newcomer.peer_id_str}: spam in round 3" in out
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
