"""A node whose checkpoint differs from the swarm's stops loudly (StateMismatchError); a
checkpointer that is merely behind does not.

Real coordinator process, real signed HTTP requests; the node side is the loop's own check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
import trio

from cnode.auth import Identity, save_identity
from cnode.node.coordinator import CoordinatorClient, load_run_config
from cnode.node.train import StateMismatchError
from cnode.node.train.checkpoint._agreement import agree_on_checkpoint
from cnode.storage import CID, compute_cid
from tests.support.forked import ForkedCoordinatorProcess

from .swarm import TINY_TRAINING


def test_a_different_checkpoint_for_the_same_round_is_a_loud_error(tmp_path: Path) -> None:
    key, a, b = Identity.generate(), Identity.generate(), Identity.generate()
    save_identity(key, tmp_path / "coordinator.key")
    (tmp_path / "run.toml").write_text(
        tomli_w.dumps(
            {
                "run": "m",
                "coordinator": key.peer_id_str,
                "rounds": {"min_participants": 1, "checkpoint_every": 1},
                "access": {"peers": [a.peer_id_str, b.peer_id_str]},
                "training": TINY_TRAINING,
            }
        ),
        encoding="utf-8",
    )
    config = load_run_config(tmp_path / "run.toml")
    state = compute_cid(b"a state", 0x71)
    agreed = compute_cid(b"the swarm's checkpoint of round 1", 0x71)
    mine = compute_cid(b"this node's different checkpoint", 0x71)

    async def scenario(url: str) -> None:
        nonlocal agreed
        async with (
            CoordinatorClient.for_run(config, a, url=url) as ca,
            CoordinatorClient.for_run(config, b, url=url) as cb,
        ):
            await ca.join()
            await cb.join()
            round_ = await ca.join_round()
            await ca.ready(round_)
            with trio.fail_after(30):
                info = await ca.wait_members(round_)
            await ca.submit_checkpoint(epoch=info.epoch, round=round_, manifest=str(agreed))
            # b (not a member) compares; a (a member) submits as a checkpointer would.
            for client, checkpointer in ((cb, False), (ca, True)):

                async def agree(
                    manifest: CID, client: CoordinatorClient = client, submit: bool = checkpointer
                ) -> None:
                    await agree_on_checkpoint(
                        client,
                        round_=round_,
                        epoch=info.epoch,
                        manifest=manifest,
                        state_cid=state,
                        submit=submit,
                    )

                with pytest.raises(StateMismatchError) as raised:
                    await agree(mine)
                assert str(mine) in str(raised.value)
                if not checkpointer:
                    assert str(agreed) in str(raised.value)
                # the same manifest as the swarm's is agreement, not an error
                await agree(agreed)

            # A checkpointer a round behind: round 2's checkpoint is recorded before it submits
            # round 1's. Nothing to compare, no reason to stop (it did stop, before).
            round_2 = await ca.join_round()
            await ca.ready(round_2)
            with trio.fail_after(30):
                info_2 = await ca.wait_members(round_2)
            later = compute_cid(b"the swarm's checkpoint of round 2", 0x71)
            await ca.submit_checkpoint(epoch=info_2.epoch, round=round_2, manifest=str(later))
            await agree_on_checkpoint(
                ca, round_=round_, epoch=info.epoch, manifest=mine, state_cid=state, submit=True
            )
            agreed = later  # what the coordinator holds now

    with ForkedCoordinatorProcess(
        tmp_path / "run.toml", tmp_path / "c.db", tmp_path / "coordinator.key"
    ) as proc:
        trio.run(scenario, proc.url)
    # nothing stored was harmed: the coordinator still holds the agreed checkpoint
    with ForkedCoordinatorProcess(
        tmp_path / "run.toml", tmp_path / "c.db", tmp_path / "coordinator.key"
    ) as proc:

        async def read() -> str:
            async with CoordinatorClient.for_run(config, a, url=proc.url) as client:
                record = (await client.run_state()).checkpoint
                assert record is not None
                return record.manifest

        assert trio.run(read) == str(agreed)
