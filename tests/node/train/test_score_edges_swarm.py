"""Score records at the edges of the scoring arithmetic, in a real partitioned swarm (issue 24
item 3, issue 29 item 1).

Real ``cnode train`` processes, the real coordinator over HTTP, real libp2p on 127.0.0.1. Member
``x`` signs every score record with issue 29's finite but extreme losses (5.0, -1e308, 5.0,
4.9), which killed every honest node with OverflowError before; member ``z`` signs records that
state every loss 0 (in range), which made ``loss_score`` raise on every honest node when it
compared the claims. Both train honestly: only their records are bad. Every round completes,
the honest nodes agree on every state, ``x``'s record is refused and ``x`` banned on the
coordinator's own check of the signed record; nobody honest is accused.

The tiny text model cannot be driven to an exactly-zero cross-entropy on real text by a finite
update, so the zero reaches the live scoring path as a signed claim (compared, disputed,
recomputed); the property tests in tests/aggregation/test_scores.py feed it as a measured loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cnode.node.coordinator import BanKind

from .swarm import Swarm, final_states

pytestmark = pytest.mark.slow

ROUNDS = 1  # both bad scorers are banned after it


def test_extreme_and_zero_losses_in_records_neither_halt_nor_split_the_swarm(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    swarm = Swarm(
        tmp_path,
        ["x", "z", "a", "b"],
        min_participants=4,
        training={"partitioned": "always", "scores": True},
        collect_timeout_s=8.0,
        backup_step_s=2.0,
    )
    swarms.append(swarm)
    bad = [swarm.start("x", "--attack", "extreme_scores", rounds=ROUNDS)]
    bad.append(swarm.start("z", "--attack", "zero_scores", rounds=ROUNDS))
    honest = [swarm.start(n, rounds=ROUNDS, checkpointer=True) for n in "ab"]
    for node in honest:
        assert swarm.wait_exit(node, timeout=240) == 0, swarm.describe()

    # Every round completed and the honest nodes agree on every state.
    finals = final_states(honest)
    assert {r for r, _ in finals.values()} == {ROUNDS}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals
    rounds = {n.name: {e["round"]: e for e in n.events("round")} for n in honest}
    for r in range(1, ROUNDS + 1):
        assert len({rounds[n.name][r]["state_cid"] for n in honest}) == 1, r

    # x's record is refused on every honest node, and x banned on the coordinator's own check
    # of that signed record (one report suffices: no majority waited for).
    x = bad[0]
    for node in honest:
        lines = node.log.read_text(errors="replace").splitlines()
        refused = [ln for ln in lines if "score_record_bad" in ln and x.peer[-8:] in ln]
        assert refused and "is not a loss in [0, MAX_SCORE_LOSS]" in refused[0], node.name
    bans = {b.peer: b for b in swarm.run_state().bans}
    assert x.peer in bans, swarm.describe()
    assert bans[x.peer].kind is BanKind.CHECKED, bans[x.peer]
    # Reported by any other member: the zero-loss signer computes the agreed scores too, and
    # may be the first to report (the coordinator checks the record, not the reporter).
    others = {n.peer for n in swarm.nodes.values()} - {x.peer}
    assert bans[x.peer].by in others, bans[x.peer]
    accused = {e["accused"] for n in honest for e in n.events("ban_reported")}
    assert accused <= {b.peer for b in bad}, accused
