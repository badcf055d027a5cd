"""Scores in a real partitioned swarm (specs/training.md#scores-in-partitioned-rounds).

Real ``cnode train`` processes, the real coordinator over HTTP, real libp2p on 127.0.0.1. A node
that trains on corrupted text (``--attack flipped_tokens``) is left out of every aggregate by the
scores its two scorers sign, and banned within 3 rounds on evidence that a replay of the
checkpoints recomputes (the losses of each low round); the honest nodes agree on every state and
none is accused. The tiny model trains 16 local steps at lr 0.01: with the swarm tests' 3 steps
at 3e-3 the attacker's harm is too small to cross the ban bound before round 5
(specs/aggregation.md, Unresolved).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from cnode.node._config import load_config
from cnode.node.coordinator import BanKind
from cnode.node.train import replay_checkpoint
from cnode.storage import CID, BlockStore, read_manifest

from .swarm import Swarm, final_states

pytestmark = pytest.mark.slow

ROUNDS = 3


def _recorded_scores(store: BlockStore, manifest: CID) -> dict[int, dict[str, Any]]:
    meta = read_manifest(store, manifest)
    meta = getattr(meta, "meta", meta)
    return {r: p["scores"] for r, p in meta.aggregation.params["rounds"]}


def test_a_data_attacker_is_left_out_and_banned_within_3_rounds_on_recomputable_evidence(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    training = {"partitioned": "always", "scores": True, "local_steps": 16, "lr": 0.01}
    swarm = Swarm(
        tmp_path,
        ["bad", "a", "b", "c"],
        min_participants=4,
        training=training,
        collect_timeout_s=8.0,
        backup_step_s=2.0,
    )
    swarms.append(swarm)
    bad = swarm.start("bad", "--attack", "flipped_tokens", rounds=ROUNDS)
    honest = [swarm.start(n, rounds=ROUNDS, checkpointer=True) for n in "abc"]
    for node in honest:
        assert swarm.wait_exit(node, timeout=300) == 0, swarm.describe()

    # Banned within 3 rounds on the first reputation report: the coordinator replayed the score
    # records it holds and found the report's figures (no majority waited for).
    (ban,) = swarm.run_state().bans
    assert ban.peer == bad.peer and ban.round <= ROUNDS, ban
    assert ban.kind is BanKind.CHECKED and ban.by in {n.peer for n in honest}, ban
    reported = [e for n in honest for e in n.events("ban_reported")]
    assert {(e["accused"], e["kind"]) for e in reported} == {(bad.peer, "reputation")}
    assert {e["accused"] for n in honest for e in n.events("ban_reported")} == {bad.peer}

    # The honest nodes agree on every round's state; the attacker's update entered none.
    finals = final_states(honest)
    assert {r for r, _ in finals.values()} == {ROUNDS}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals
    rounds = {n.name: {e["round"]: e for e in n.events("round")} for n in honest}
    for r in range(1, ROUNDS + 1):
        assert len({rounds[n.name][r]["state_cid"] for n in honest}) == 1, r
        assert bad.peer not in rounds["a"][r]["members"], r
        assert rounds["a"][r]["dropped"][bad.peer].startswith("left out by scores"), r
        # An honest update that does not measurably help its own data may sit a round out.
        assert 2 * len(rounds["a"][r]["members"]) >= len(honest), r

    # Every checkpoint replays: partitions, scores, reputations and admission, from the signed
    # headers and score records. The ban evidence's losses are the replayed ones.
    store = BlockStore(tmp_path / "verifier")
    for node in [*honest, bad]:
        held = BlockStore(load_config(node.home).blocks_dir(node.home))
        for cid in held.iter_cids():
            if not store.has(cid):
                store.put(cid, held.get(cid))
    recorded: dict[int, dict[str, Any]] = {}
    for r in range(1, ROUNDS + 1):
        manifest = CID.parse(str(rounds["a"][r]["manifest"]))
        report = replay_checkpoint(store, manifest)
        assert str(report.state_cid) == rounds["a"][r]["state_cid"]
        recorded |= _recorded_scores(store, manifest)
    evidence = next(
        e["figures"] for e in honest[0].events("ban_reported") if e["accused"] == bad.peer
    )
    assert len(evidence["rounds"]) == 3
    for r, seed, scores, reputation, bound in zip(
        evidence["rounds"],
        evidence["seeds"],
        evidence["scores"],
        evidence["reputations"],
        evidence["bounds"],
        strict=True,
    ):
        assert recorded[r]["seed"] == seed
        losses = recorded[r]["peers"][bad.peer]
        for key, value in zip(
            ("own_before", "own_after", "held_before", "held_after"), losses[:4], strict=False
        ):
            assert math.isclose(scores[key], value, rel_tol=1e-12), (r, key)
        # The ban is on the reputation (a running average of the scores), so one round's score
        # may be positive while the reputation stays below the bound.
        assert scores["score"] == losses[6]
        assert reputation < bound, (r, reputation, bound)
        assert set(recorded[r]["records"]) == {bad.peer, *(n.peer for n in honest)}
