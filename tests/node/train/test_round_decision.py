"""One round decision (issue 36): the same inputs give the same admitted set, aggregate and ban
evidence in the node's full round, the node's partitioned round and ``decide_round``, which is
what ``bench/robustness.py`` calls.

Real NodeTrainers (block stores, signatures, torch training, scoring) without the network, as
in test_partitioned.py: five members, one training on flipped tokens (the scores leave it out)
and one sending NaN (every path rejects it: ban evidence at once).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cnode.aggregation import (
    EvidenceKind,
    RoundEvidence,
    decide_round,
    score_seed,
    scored_config,
    validate_update,
)
from cnode.node.train._round import expected_specs, load_update
from cnode.node.train._trainer import NodeTrainer
from cnode.node.train.model._outer import outer_step
from cnode.node.train.model._state import state_cid
from cnode.node.train.scores._records import (
    ScoreRecord,
    TargetLosses,
    open_score_record,
    score_record_cid,
    seal_score_record,
)
from cnode.node.train.scores._spread import (
    INVALID_PREFIX,
    SpreadRecords,
    resolve_scores,
    targets_of,
)

from .test_partition_scores import CONFIG
from .test_partitioned import RUN, _copy_all, _node, _share

pytestmark = pytest.mark.slow


def _records(nodes: list[NodeTrainer], headers: dict, seed: bytes) -> dict:
    """Each member scores its assigned targets as a scorer does: an invalid update is unscored
    with the reason, a valid one gets its four losses."""
    members = sorted(headers)
    out = {}
    for node in nodes:
        assert node.scoring is not None
        scores, unscored = {}, {}
        for target in targets_of(RUN, 1, members, node.peer):
            cid, header = headers[target]
            update = load_update(node.store, header.update, peer=target,
                                 codec=CONFIG.update_codec, shapes=node.state)  # fmt: skip
            why = validate_update(update, expected_specs(node.state))
            if why is not None:
                unscored[target] = INVALID_PREFIX + why
                continue
            scores[target] = TargetLosses(
                cid, *node.scoring.measure(1, seed, node.state, target, update)
            )
        record = ScoreRecord(RUN, 1, node.peer, node.state_cid, seed, scores, unscored)
        envelope = seal_score_record(node.identity, record)
        cid = score_record_cid(envelope)
        for other in nodes:
            other.store.put(cid, envelope)
        out[node.peer] = (cid, open_score_record(envelope, run=RUN, round_=1, signer=node.peer))
    return out


def test_full_partitioned_and_bench_rounds_decide_alike(tmp_path: Path) -> None:
    attacks = ["flipped_tokens", "nan", None, None, None]
    nodes = [_node(tmp_path, i, CONFIG, attack) for i, attack in enumerate(attacks)]
    flipped, broken = nodes[0].peer, nodes[1].peer
    own = [n.train(1) for n in nodes]
    headers = _share(nodes, own)
    members = sorted(headers)
    parent = dict(nodes[2].state)
    updates = {
        m: load_update(nodes[2].store, h.update, peer=m, codec=CONFIG.update_codec, shapes=parent)
        for m, (_, h) in headers.items()
    }

    # The node's partitioned round: spread scores, one aggregator per partition, assembly.
    seed = score_seed(str(c) for c, _ in headers.values())
    common = SpreadRecords(RUN, 1, members, {m: c for m, (c, _) in headers.items()},
                         nodes[2].state_cid, seed, _records(nodes, headers, seed))  # fmt: skip
    spread = resolve_scores(common, reputation={}, recompute=lambda t: pytest.fail(t))
    parts = len(members)
    results = {}
    for p in range(parts):
        node = nodes[p]
        inputs = {m: h for m, h in headers.items() if m in spread.inputs}
        missing = {m: spread.left_out[m] for m in headers if m not in spread.inputs}
        envelope, result = node.aggregate_partition(
            1,
            inputs,
            partition=p,
            parts=parts,
            missing=missing,  # type: ignore[arg-type]
        )
        results[p] = (node.store.put_new(envelope, 0x71), result)
    for a in nodes:
        for b in nodes:
            if a is not b:
                _copy_all(a.store, b.store)
    outputs = {p: r.output for p, (_, r) in results.items()}
    partitioned = nodes[3].apply_partitions(
        1,
        results,
        outputs,
        parts=parts,
        dropped={},
        scores=spread,  # type: ignore[arg-type]
    )

    # The node's full round, on a node that holds every update and scores them itself.
    judge = _node(tmp_path, 9, CONFIG)
    _copy_all(nodes[3].store, judge.store)
    full = judge.aggregate(1, headers, {})  # type: ignore[arg-type]
    full_scores = judge.since_checkpoint[-1].params["scores"]

    # The bench's decision: decide_round on the same updates, the agreed scores, no history.
    def decide(partitioned_: bool):  # type: ignore[no-untyped-def]
        return decide_round(
            1, members, updates, expected=expected_specs(parent), config=scored_config(),
            evidence=RoundEvidence(scored=True), scores=spread.scores, seed=spread.seed,
            reputation={}, partitioned=partitioned_,
            update_cids={m: str(h.update) for m, (_, h) in headers.items()},
        )  # fmt: skip

    bench_full, bench_part = decide(False), decide(True)

    # The admitted set: the same in all four; the flipped-token update is left out by scores.
    honest = sorted(m for m in members if m not in (flipped, broken))
    assert list(spread.admitted) == full_scores["admitted"] == honest
    assert sorted(set(bench_full.inputs) - {broken}) == honest
    assert bench_full.inputs == bench_part.inputs == spread.inputs
    assert sorted(full.members) == sorted(partitioned.members) == honest
    assert bench_part.reputation == spread.reputation == full_scores["reputation"]
    assert set(bench_part.left_out) == {flipped}

    # The aggregate: the bench's full decision gives the full round's state bit for bit, its
    # partitioned decision the partitioned round's.
    for decision, node_state in ((bench_full, judge), (bench_part, nodes[3])):
        assert decision.aggregate is not None
        new, _ = outer_step(parent, None, decision.aggregate, CONFIG)
        assert state_cid(new) == node_state.state_cid

    # The evidence: the NaN update is rejected, with the same kind, in every path.
    for bans in (full.bans, partitioned.bans, bench_full.evidence, bench_part.evidence):
        assert [(b.peer, b.kind) for b in bans] == [(broken, EvidenceKind.REJECTED)], bans
