"""The outer momentum in a real swarm (issue 26): a nesterov run of real `cnode train` processes
with a late joiner, which takes the momentum over with the checkpoint; every node ends on one
state, and the last checkpoint (state and momentum layers) replays from its parent's."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnode.node.train import replay_checkpoint
from cnode.storage import CID, BlockStore

from .swarm import Swarm, final_states

pytestmark = pytest.mark.slow


def test_a_late_joiner_takes_the_momentum_over_and_replay_reproduces_it(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    swarm = Swarm(tmp_path, ["a", "b", "late"], min_participants=2,
                  training={"outer_optimizer": "nesterov", "partitioned": "never"})  # fmt: skip
    swarms.append(swarm)
    rounds = 4
    a = swarm.start("a", rounds=rounds, checkpointer=True)
    b = swarm.start("b", rounds=rounds)
    late = swarm.start("late", "--join-after-round", "1", rounds=rounds)
    for node in (a, b, late):
        assert swarm.wait_exit(node, timeout=240) == 0, swarm.describe()
    (caught,) = late.events("caught_up")
    assert late.events("round")[0]["round"] == caught["round"] + 1
    finals = final_states([a, b, late])
    assert {r for r, _ in finals.values()} == {rounds}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals  # momentum agreed too
    last = a.events("round")[-1]["manifest"]
    report = replay_checkpoint(BlockStore(a.home / "blocks"), CID.parse(last))
    assert report.rounds == (rounds,)
