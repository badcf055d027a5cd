"""Warmup and Cooldown timing, token refresh, and `cnode coordinator new-run`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from cnode.auth import Identity, load_identity
from cnode.node.cli import main
from cnode.node.coordinator import (
    CoordinatorClient,
    JoinResult,
    Phase,
    RoundStatus,
    load_run_config,
)

from .conftest import Running, run_config


def client(running: Running, peer: Identity) -> CoordinatorClient:
    return CoordinatorClient(
        running.url, run="test-run", coordinator=running.peer_id, identity=peer
    )


async def wait_phase(c: CoordinatorClient, phase: Phase) -> None:
    with trio.fail_after(10):
        while (await c.run_state()).phase is not phase:
            await trio.sleep(0.05)


def test_warmup_holds_the_list_open_until_training(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=1, warmup_s=0.6))

    async def main_() -> None:
        async with client(running, peers[0]) as a:
            await a.join()
            await a.join_round()
            state = await a.run_state()
            assert state.phase is Phase.WARMUP and state.phase_until_ms is not None
            await a.ready(1)  # recorded, but the list closes only in Training
            assert (await a.round_info(1)).status is RoundStatus.OPEN
            with trio.fail_after(10):
                info = await a.wait_members(1)  # published once Warmup is over
            assert info.members == [peers[0].peer_id_str]
            with running.admin() as admin:
                log = admin.log()
            kinds = [e["kind"] for e in log if e["kind"] in ("phase", "round_closed")]
            phases = [e["detail"].get("phase") for e in log if e["kind"] == "phase"]
            assert phases[:2] == ["Warmup", "Training"]
            assert kinds.index("round_closed") > kinds.index("phase", 1)

    trio.run(main_)


def test_cooldown_ends_at_its_deadline_without_a_checkpoint(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=1, checkpoint_every=1, cooldown_s=0.5))

    async def main_() -> None:
        async with client(running, peers[0]) as a:
            await a.join()
            await a.join_round()
            await a.ready(1)
            assert (await a.run_state()).phase is Phase.COOLDOWN
            assert await a.join_round() == 2  # joining during Cooldown is fine
            await wait_phase(a, Phase.TRAINING)
            state = await a.run_state()
            assert state.epoch == 1 and state.round.round == 2 and state.round.epoch == 1

    trio.run(main_)


def test_client_rejoins_before_its_token_expires(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers, min_participants=2))

    async def main_() -> None:
        async with client(running, peers[0]) as a:
            first = await a.join()
            soon = int(time.time() * 1000) + 5_000  # within the refresh margin
            a.resume(JoinResult(first.token, first.peer, first.username, soon))
            assert await a.join_round() == 1
            assert a.joined is not None and a.joined.expires_at_ms > soon

    trio.run(main_)


@pytest.fixture
def cli_logging() -> Iterator[None]:
    try:
        yield
    finally:
        structlog.reset_defaults()


def test_new_run_writes_a_config_pinning_the_key(tmp_path: Path, cli_logging: None) -> None:
    key, out = tmp_path / "coord.key", tmp_path / "run.toml"
    code = main(
        [
            "coordinator",
            "new-run",
            "demo",
            "--key",
            str(key),
            "--out",
            str(out),
            "--min-participants",
            "3",
            "--peer",
            Identity.generate().peer_id_str,
        ]
    )
    assert code == 0
    config = load_run_config(out)
    assert config.coordinator == load_identity(key).peer_id_str
    assert config.rounds.min_participants == 3 and len(config.access.peers) == 1
    assert key.stat().st_mode & 0o777 == 0o600
    # A new run sends sparse updates (with the error-feedback decay they were measured with)
    # and partitions rounds of 3+ unless told otherwise.
    assert config.training == {
        "update_codec": "sparse-topk", "error_decay": 0.95, "partitioned": "auto",
    }  # fmt: skip
    other = tmp_path / "f32.toml"
    args = ["coordinator", "new-run", "d2", "--key", str(key), "--out", str(other)]
    assert main([*args, "--update-codec", "f32", "--partitioned", "never"]) == 0
    assert load_run_config(other).training == {"update_codec": "f32", "partitioned": "never"}
    sparse = ["--update-codec", "sparse-topk", "--update-density", "0.03125"]
    assert main([*args, *sparse]) == 0
    assert load_run_config(other).training == {
        "update_codec": "sparse-topk", "error_decay": 0.95, "partitioned": "auto",
        "update_density": 0.03125,
    }  # fmt: skip
    int8 = ["--update-codec", "int8-blockwise"]  # the other codecs get their name only
    assert main([*args, *int8]) == 0
    assert load_run_config(other).training == {
        "update_codec": "int8-blockwise",
        "partitioned": "auto",
    }
    assert main([*args, *int8, "--update-density", "0.5"]) == 2  # only with sparse-topk
    assert main([*args, "--update-codec", "sparse-topk", "--update-density", "2"]) == 2


def test_two_clients_with_one_key_recover_from_counter_order(serve: Any, peers: Any) -> None:
    """The CLI beside a running node (same key): a counter below the other's is resent once."""
    running = serve(run_config(peers))
    with running.admin() as first, running.admin() as second:
        first._core._counter = time.time_ns() // 1000 + 500_000  # its clock runs 0.5 s ahead
        assert first.allowlist_add("alice")
        assert second.allowlist_add("bob")  # refused as replayed once, then resent: accepted
        assert {e["value"] for e in second.allowlist()} >= {"alice", "bob"}
