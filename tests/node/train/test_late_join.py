"""Late join in a run that checkpoints every fourth round: the joiner cannot start from the
round it was first placed in (no checkpoint of the round before), so it leaves it, waits for the
next checkpoint, joins the round after it, and ends bit-identical with the others.

Every fourth, not every second: joining after round 1, the joiner is placed in round 2, 3 or 4
depending on how fast the others go, and none of their parents has a checkpoint. With every
second round, a busy machine placed it in round 3, whose parent has one, and it never waited.

The second swarm (a run whose only checkpointer joins late) runs DiLoCo's outer Nesterov
(issue 26), full rounds: the joiner takes the momentum over with the checkpoint, every node ends
on one state (momentum agreed too), and the last checkpoint, state and momentum layers, replays
from its parent's. (One swarm for both: the suite's time.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cnode.node.train import replay_checkpoint
from cnode.storage import CID, BlockStore

from .swarm import Node, Swarm, final_states

pytestmark = pytest.mark.slow


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    made = Swarm(tmp_path, ["a", "b", "late"], min_participants=2, checkpoint_every=4)
    try:
        yield made
    finally:
        made.close()


def test_a_joiner_waits_for_the_next_checkpoint_and_agrees(swarm: Swarm) -> None:
    rounds = 5
    a = swarm.start("a", rounds=rounds, checkpointer=True)
    b = swarm.start("b", rounds=rounds)
    late = swarm.start("late", "--join-after-round", "1", rounds=rounds)
    for node in (a, b, late):
        assert swarm.wait_exit(node, timeout=240) == 0, swarm.describe()

    # A checkpoint exists for round 4 only.
    assert [e["manifest"] is not None for e in a.events("round")] == [
        False, False, False, True, False,
    ]  # fmt: skip
    # The joiner was placed in a round whose parent had no checkpoint, waited, and caught up
    # from the checkpoint of round 4.
    waits = late.events("waiting_for_checkpoint")
    assert waits and waits[0]["want"] == 4, late.events()
    (caught,) = late.events("caught_up")
    assert caught["round"] == 4 and caught["source"] == "peers"
    # The members announced none of their round checkpoints on gossip (each member's round
    # report names it; specs/announce.md rule 2): the joiner asked the members the state lists,
    # then announced the checkpoint it caught up to, as any holder outside the round record.
    assert caught["bytes"] > 0 and set(caught["bytes_per_holder"]) <= {a.peer, b.peer}, caught
    for member in (a, b):
        assert '"hold_announced"' not in member.log.read_text(), member.name
    assert f'"manifest": "{caught["manifest"]}"' in _announced(late), late.name
    assert late.events("round")[0]["round"] == caught["round"] + 1
    finals = final_states([a, b, late])
    assert {r for r, _ in finals.values()} == {rounds}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals


def _announced(node: Node) -> str:
    """The ``hold_announced`` lines of ``node``'s log."""
    lines = node.log.read_text().splitlines()
    return "\n".join(line for line in lines if '"hold_announced"' in line)


def test_the_runs_only_checkpointer_joins_late_from_the_members_checkpoints(
    tmp_path: Path,
) -> None:
    # Before, only --checkpointer nodes submitted checkpoints: a run whose only checkpointer
    # missed round 1 recorded none, and that checkpointer waited for one forever.
    swarm = Swarm(tmp_path, ["a", "b", "cp"], min_participants=2,
                  training={"outer_optimizer": "nesterov", "partitioned": "never"})  # fmt: skip
    try:
        rounds = 3
        a = swarm.start("a", rounds=rounds)
        b = swarm.start("b", rounds=rounds)
        swarm.wait("round 1 on a and b", lambda: min(a.last_round(), b.last_round()) >= 1, 180)
        cp = swarm.start("cp", rounds=rounds, checkpointer=True)
        for node in (a, b, cp):
            assert swarm.wait_exit(node, timeout=240) == 0, swarm.describe()

        # Nobody confirmed round 1's checkpoint, so the members submitted their own.
        assert "checkpoint_submitted_unconfirmed" in a.log.read_text() + b.log.read_text()
        (caught,) = cp.events("caught_up")
        assert caught["source"] == "peers" and caught["round"] in (1, 2), cp.events()
        assert cp.events("round")[0]["round"] == caught["round"] + 1
        finals = final_states([a, b, cp])
        assert {r for r, _ in finals.values()} == {rounds}, finals
        assert len({cid for _, cid in finals.values()}) == 1, finals  # momentum agreed too
        last = cp.events("round")[-1]["manifest"]
        report = replay_checkpoint(BlockStore(cp.home / "blocks"), CID.parse(last))
        assert report.rounds == (rounds,)
    finally:
        swarm.close()
