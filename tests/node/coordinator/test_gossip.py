"""The coordinator publishes its signed run state on the run's gossipsub topic."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
import trio

from cnode.auth import Identity, save_identity
from cnode.node.coordinator import (
    AccessConfig,
    CoordinatorClient,
    RoundsConfig,
    RunConfig,
    RunState,
    run_state_topic,
    run_state_validator,
)
from cnode.node.p2p import P2PSettings, open_p2p_node
from cnode.storage import BlockStore
from tests.support.forked import ForkedCoordinatorProcess

pytestmark = pytest.mark.slow


def test_state_changes_arrive_over_gossipsub(tmp_path: Path) -> None:
    key, peer = Identity.generate(), Identity.generate()
    save_identity(key, tmp_path / "coordinator.key")
    config = RunConfig(
        run="gossip-run",
        coordinator=key.peer_id_str,
        rounds=RoundsConfig(min_participants=2),
        access=AccessConfig(peers=[peer.peer_id_str]),
    )
    (tmp_path / "run.toml").write_text(tomli_w.dumps(config.to_dict()))
    proc = ForkedCoordinatorProcess(
        tmp_path / "run.toml",
        tmp_path / "state.db",
        tmp_path / "coordinator.key",
        p2p_listen="/ip4/127.0.0.1/tcp/0",
    )

    async def main() -> RunState:
        received: list[RunState] = []
        async with (
            open_p2p_node(
                peer, BlockStore(tmp_path / "blocks"), P2PSettings(), allow=lambda _p: True
            ) as node,
            CoordinatorClient(
                proc.url, run="gossip-run", coordinator=key.peer_id_str, identity=peer
            ) as client,
        ):
            state = await client.run_state()
            assert state.p2p_addrs == proc.p2p_addrs and state.p2p_addrs
            await node.connect(state.p2p_addrs[0])
            validator = run_state_validator("gossip-run", key.peer_id_str)
            async with node.subscribe(run_state_topic("gossip-run"), validator) as sub:
                await client.join()

                async def churn() -> None:  # changes, so newer states keep being published
                    while True:
                        await client.join_round()
                        await trio.sleep(0.5)
                        await client.leave(1)
                        await trio.sleep(0.5)

                with trio.fail_after(30):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(churn)
                        async for opened in sub:
                            received.append(RunState.from_payload(opened.payload))
                            if received[-1].version > state.version:
                                nursery.cancel_scope.cancel()
                                break
        return received[-1]

    with proc:  # starts the process; stops it on the way out
        last = trio.run(main)
    assert last.coordinator == key.peer_id_str and last.run == "gossip-run"
    assert last.phase.value == "WaitingForMembers"
