"""A real coordinator process killed with SIGKILL mid-round loses nothing it acknowledged."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import trio

from cnode.auth import Identity, load_identity, save_identity
from cnode.node.coordinator import (
    AccessConfig,
    CoordinatorClient,
    CoordinatorError,
    CoordinatorRejected,
    JoinResult,
    RoundsConfig,
    RoundStatus,
    RunConfig,
    SyncCoordinatorClient,
)
from cnode.node.coordinator.server import CoordinatorProcess
from tests.support.forked import ForkedCoordinatorProcess

pytestmark = pytest.mark.slow


def write_config(tmp_path: Path, key: Identity, peers: list[Identity]) -> Path:
    config = RunConfig(
        run="crash-run",
        coordinator=key.peer_id_str,
        rounds=RoundsConfig(min_participants=2, round_timeout_s=60.0),
        access=AccessConfig(peers=[p.peer_id_str for p in peers]),
    )
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(config.to_dict()))
    return path


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path, Identity, list[Identity]]:
    key = Identity.generate()
    save_identity(key, tmp_path / "coordinator.key")
    peers = [Identity.generate() for _ in range(24)]
    config = write_config(tmp_path, key, peers)
    return config, tmp_path / "state.db", tmp_path / "coordinator.key", key, peers


def client(proc: CoordinatorProcess, peer: Identity) -> CoordinatorClient:
    # A short outage limit: these tests kill the coordinator and look at what was acknowledged;
    # waiting out the restart is test_discovery's (and the swarm's) business.
    return CoordinatorClient(
        proc.url, run="crash-run", coordinator=proc.peer_id, identity=peer, outage_s=1.0
    )


def test_sigkill_mid_round_then_restart_continues(setup: Any) -> None:
    config, db, key_path, key, peers = setup
    a_id, b_id, c_id = peers[:3]
    proc = ForkedCoordinatorProcess(config, db, key_path)
    try:
        proc.start()
        assert proc.peer_id == key.peer_id_str

        async def before_kill() -> tuple[list[JoinResult], int]:
            a, b, c = (client(proc, p) for p in (a_id, b_id, c_id))
            for cl in (a, b, c):
                await cl.join()
            assert await a.join_round() == 1
            assert await b.join_round() == 1
            await a.ready(1)  # the list of round 1 closes
            assert await c.join_round() == 2
            tokens = [cl.joined for cl in (a, b, c) if cl.joined is not None]
            version = (await a.run_state()).version
            for cl in (a, b, c):
                await cl.aclose()
            return tokens, version

        tokens, version = trio.run(before_kill)
        proc.kill()  # SIGKILL in the middle of round 1
        proc.start()

        async def after_restart() -> None:
            a, b, c = (client(proc, p) for p in (a_id, b_id, c_id))
            state = await a.run_state()
            assert state.version == version
            assert state.round.round == 1 and state.round.status is RoundStatus.CLOSED
            assert (state.round.joined, state.round.ready) == (2, 1)
            assert (await a.round_info(2)).joined == 1
            # Tokens issued before the crash still work (same key; the expiry is inside them).
            for cl, joined in zip((a, b, c), tokens, strict=True):
                cl.resume(joined)
            await b.ready(1)
            with trio.fail_after(10):
                info = await a.wait_members(1)
            assert info.members == sorted([a_id.peer_id_str, b_id.peer_id_str])
            state = await c.run_state()
            assert state.round.round == 2 and state.round.joined == 1
            for cl in (a, b, c):
                await cl.aclose()

        trio.run(after_restart)
    finally:
        proc.stop()


def test_acknowledged_requests_survive_a_kill_under_load(setup: Any) -> None:
    config, db, key_path, _key, peers = setup
    proc = ForkedCoordinatorProcess(config, db, key_path)
    acknowledged: list[str] = []
    try:
        proc.start()

        async def load() -> None:
            clients = [client(proc, p) for p in peers]
            for cl in clients:
                await cl.join()
            killed = asyncio.Event()

            async def one(cl: CoordinatorClient) -> None:
                try:
                    await cl.join_round()
                except CoordinatorError:
                    return  # not acknowledged: may or may not be stored
                acknowledged.append(cl._core.identity.peer_id_str)
                if len(acknowledged) == 8 and not killed.is_set():
                    killed.set()
                    proc.kill()

            await asyncio.gather(*(one(cl) for cl in clients))
            for cl in clients:
                await cl.aclose()

        asyncio.run(load())
        assert 8 <= len(acknowledged) <= len(peers)
        proc.start()
        with SyncCoordinatorClient(
            proc.url,
            run="crash-run",
            coordinator=proc.peer_id,
            identity=Identity.from_seed(b"\x00" * 32),
        ) as anyone:
            state = anyone.run_state()
        with SyncCoordinatorClient(
            proc.url, run="crash-run", coordinator=proc.peer_id, identity=load_identity(key_path)
        ) as admin:
            entries = admin.log()
        stored = {e["actor"] for e in entries if e["kind"] == "join_round"}
        assert set(acknowledged) <= stored
        assert state.round.joined == len(stored)
        # The run goes on after the restart.
        with (
            SyncCoordinatorClient(
                proc.url, run="crash-run", coordinator=proc.peer_id, identity=peers[0]
            ) as c,
            pytest.raises(CoordinatorRejected),
        ):
            c.admin("allowlist.ls")  # a peer is no admin: the server answers, state intact
    finally:
        proc.stop()
