"""Partitioned rounds in a real swarm (specs/training.md#partitioned-rounds).

Real ``cnode train`` processes, the real coordinator over HTTP, real libp2p on 127.0.0.1.
Covers, in one swarm: a lying aggregator (``--attack wrong_partition``) is caught in the round it
lies, banned by the coordinator on its own recomputation, and every honest node ends that round
on the recomputed state; a withholding aggregator's partition passes to its backup and the rounds
complete.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cnode.node._config import load_config
from cnode.node.coordinator import BanKind
from cnode.node.train import StopReason, replay_checkpoint
from cnode.storage import CID, BlockStore

from .swarm import Swarm, final_states

pytestmark = pytest.mark.slow


def _rounds_of(node: object) -> dict[int, dict[str, object]]:
    return {e["round"]: e for e in node.events("round")}  # type: ignore[attr-defined]


def test_a_liar_is_banned_in_the_round_it_lies_and_a_withholder_is_backed_up(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    # One swarm for both faults (the suite's time): a liar and a withholder among five.
    rounds = 2
    # Every member recomputes every other partition: the liar is caught whatever the seed.
    training = {"partitioned": "always", "verify_partitions": 4}
    swarm = Swarm(
        tmp_path,
        ["liar", "a", "b", "c", "quiet"],
        min_participants=4,
        training=training,
        collect_timeout_s=8.0,
        backup_step_s=2.0,
    )
    swarms.append(swarm)
    # The liar starts first, so it is a member of round 1 (the list needs 4 members). Every
    # honest node checkpoints: whichever make round 1 (on a loaded machine one may start
    # late), a checkpoint of it exists for the others to catch up from.
    liar = swarm.start("liar", "--attack", "wrong_partition", rounds=rounds)
    a = swarm.start("a", rounds=rounds, checkpointer=True)
    b = swarm.start("b", rounds=rounds, checkpointer=True)
    c = swarm.start("c", rounds=rounds, checkpointer=True)
    quiet = swarm.start("quiet", "--attack", "withhold", rounds=rounds)
    honest = [a, b, c]
    assert liar.proc.wait(timeout=240) == StopReason.BANNED.exit_code, swarm.describe()
    assert liar.events("stopped")[-1]["stop_reason"] == "banned"

    # The liar: banned by the coordinator itself, on its recomputation, in round 1 (its first).
    (ban,) = swarm.run_state().bans
    assert ban.peer == liar.peer and ban.round == 1 and ban.kind is BanKind.PARTITION, ban
    assert ban.by and ban.by != liar.peer, ban  # the member that sent the evidence
    for node in honest:
        assert swarm.wait_exit(node, timeout=240) == 0, swarm.describe()
    finals = final_states(honest)
    assert {r for r, _ in finals.values()} == {rounds}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals
    in_round1 = [n for n in honest if 1 in _rounds_of(n)]
    assert len(in_round1) >= 2
    round1 = {n.name: _rounds_of(n)[1]["state_cid"] for n in in_round1}
    assert len(set(round1.values())) == 1, round1
    # Round 1's state is the recomputed one: its checkpoint replays from the signed inputs
    # (a replay applies recomputations, never the signed outputs).
    store = BlockStore(tmp_path / "verifier")
    for node in [*honest, liar, quiet]:
        held = BlockStore(load_config(node.home).blocks_dir(node.home))
        for cid in held.iter_cids():
            if not store.has(cid):
                store.put(cid, held.get(cid))
    first = in_round1[0]
    manifest = CID.parse(str(_rounds_of(first)[1]["manifest"]))
    assert str(replay_checkpoint(store, manifest).state_cid) == round1[first.name]
    # The round event splits a partitioned round's bytes and seconds (bench/round.py reads them).
    for node in honest:
        for event in _rounds_of(node).values():
            split = event["bytes_in_by"]
            assert set(split) == {"exchange", "verify", "scores"}, event  # type: ignore[arg-type]
            assert sum(split.values()) == event["bytes_in"] > 0, event  # type: ignore[union-attr]
            # Every block byte: the update bytes and the roots and records that name them.
            assert event["blocks_in"] > event["bytes_in"], event  # type: ignore[operator]
            assert {"aggregate", "results", "verify", "assemble"} <= set(event["phases"]), event  # type: ignore[arg-type]
            assert event["published_at"] <= event["assembled_at"], event  # type: ignore[operator]
    # No honest node was ever accused.
    assert {e["accused"] for n in honest for e in n.events("ban_reported")} <= {liar.peer}

    # The withholder: in each round it was a member of, a backup's result stands for its
    # partition and the record says why; its own update reached no partition.
    checked = 0
    for r in range(1, rounds + 1):
        info = swarm.round_info(r)
        if quiet.peer not in info.members:
            continue
        mine = info.aggregators.index(quiet.peer)
        entry = info.results[str(mine)]
        assert entry.peer != quiet.peer, entry
        if entry.peer == liar.peer:  # the liar was its backup, and lied again: replaced
            assert entry.replaced is not None, entry
        else:
            assert entry.peer in {n.peer for n in honest}, entry
        assert "no result by the deadline" in info.excluded[quiet.peer]
        assert quiet.peer not in _rounds_of(a)[r]["members"]  # type: ignore[operator]
        checked += 1
    assert checked >= 1
    swarm.signal(quiet, signal.SIGTERM)
