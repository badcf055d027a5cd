"""Rejected is not missing (issue 36): attackers the scores always reject neither stall the swarm
nor stay in it.

Real coordinator and ``cnode train`` processes on 127.0.0.1, the swarm's defaults (scores on,
partitioned rounds): 3 honest nodes and 2 attackers sending noise (``--attack gaussian``, each
its own), so the attackers are 2 of the 5 members every round until their ban. Before issue
36 a partition result needed its *inputs* to be a strict majority of the members: 2 rejected
updates and 1 late honest slice froze a round, and a round that applied nothing moved no
reputation, so the attackers stayed. Now rejected updates count as decided: every round applies
an update, the attackers' harm is evidence (blatant) and both are banned, and the honest nodes
agree on one state every round.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cnode.node.train import StopReason

from .swarm import Swarm, final_states

pytestmark = pytest.mark.slow

ROUNDS = 7


def test_rejected_attackers_do_not_stall_the_swarm_and_are_banned(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    training = {"partitioned": "always", "scores": True, "local_steps": 16, "lr": 0.01}
    swarm = Swarm(
        tmp_path,
        ["evil1", "evil2", "a", "b", "c"],
        min_participants=3,  # the rounds after the bans have 3 members
        training=training,
        collect_timeout_s=8.0,
        backup_step_s=2.0,
        fixed_identities=True,
    )
    swarms.append(swarm)
    attackers = [swarm.start(n, "--attack", "gaussian", rounds=ROUNDS) for n in ("evil1", "evil2")]
    honest = [swarm.start(n, rounds=ROUNDS, checkpointer=n == "a") for n in "abc"]
    for node in honest:
        assert swarm.wait_exit(node, timeout=300) == 0, swarm.describe()

    # The honest nodes agree on one state in every round, and every round applied an update.
    # (A node that started a little late joins in round 2: min_participants is 3, so that the
    # rounds after the bans go on with the three honest nodes.)
    finals = final_states(honest)
    assert {r for r, _ in finals.values()} == {ROUNDS}, finals
    rounds = {n.name: {e["round"]: e for e in n.events("round")} for n in honest}
    common = sorted(set.intersection(*(set(r) for r in rounds.values())))
    assert common == list(range(common[0], ROUNDS + 1)) and common[0] <= 2, common
    bad = {n.peer for n in attackers}
    for r in common:
        assert len({rounds[n.name][r]["state_cid"] for n in honest}) == 1, r
        applied = set(rounds["a"][r]["members"])
        assert applied and not applied & bad, (r, rounds["a"][r])
    states = [rounds["a"][r]["state_cid"] for r in common]
    assert len(set(states)) == len(common), states  # no round kept its parent
    # The attackers were members, and their updates were decided out, not lost.
    left_out = [r for r in common if bad <= set(rounds["a"][r]["dropped"])]
    assert left_out, {r: rounds["a"][r]["dropped"] for r in common}

    # Both attackers are banned on the honest majority's evidence, and nobody else.
    bans = swarm.run_state().bans
    assert {b.peer for b in bans} == bad, bans
    for node in attackers:
        assert node.proc.wait(timeout=60) == StopReason.BANNED.exit_code, swarm.describe()
    accused = {e["accused"] for n in honest for e in n.events("ban_reported")}
    assert accused <= bad, accused
