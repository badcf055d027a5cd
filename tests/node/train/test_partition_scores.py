"""Scores spread over a partitioned round, without the network (specs/training.md
#scores-in-partitioned-rounds): real NodeTrainers score their assigned targets and sign records,
one scorer lies, every node agrees the same scores (the dispute recomputed, the liar named),
the partitions aggregate only the admitted updates, and a replay of the checkpoint reproduces
the scores, the reputations and the state bit for bit. Blocks move by copying, as in
test_partitioned.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnode.aggregation import score_seed
from cnode.auth import Identity
from cnode.node.train import CatchUpError, TrainingConfig, replay_checkpoint
from cnode.node.train._round import load_update
from cnode.node.train._trainer import NodeTrainer
from cnode.node.train.checkpoint._checkpoint import read_training_checkpoint
from cnode.node.train.checkpoint._signed import check_signed_updates
from cnode.node.train.scores._records import (
    ScoreRecord,
    TargetLosses,
    open_score_record,
    score_record_cid,
    seal_score_record,
)
from cnode.node.train.scores._spread import (
    SpreadRecords,
    SpreadScores,
    disputed_targets,
    resolve_scores,
    scorers_of,
    targets_of,
)
from cnode.storage import CID, DAG_CBOR, BlockStore, compute_cid

from .test_partitioned import RUN, _copy_all, _node, _share

# The swarm tests' tiny model, trained hard enough that flipped tokens visibly hurt.
CONFIG = TrainingConfig.from_dict(
    {
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32},
        "data": {"seq_len": 32, "eval_sequences": 16},
        "local_steps": 16,
        "batch_size": 4,
        "lr": 0.01,
        "scores": True,
        "partitioned": "always",
    }
)


def _records(
    nodes: list[NodeTrainer], headers: dict, seed: bytes, liar: str, lie_about: str
) -> dict[str, tuple[CID, ScoreRecord]]:
    members = sorted(n.peer for n in nodes)
    out = {}
    for node in nodes:
        assert node.scoring is not None
        scores = {}
        for target in targets_of(RUN, 1, members, node.peer):
            cid, header = headers[target]
            update = load_update(
                node.store, header.update, peer=target, codec=CONFIG.update_codec,
                shapes=node.state,
            )  # fmt: skip
            losses = node.scoring.measure(1, seed, node.state, target, update)
            if node.peer == liar and target == lie_about:
                losses = (losses[0], losses[0] * 1.5, losses[2], losses[3])  # "it hurt a lot"
            scores[target] = TargetLosses(cid, *losses)
        record = ScoreRecord(RUN, 1, node.peer, node.state_cid, seed, scores, {})
        envelope = seal_score_record(node.identity, record)
        cid = score_record_cid(envelope)
        for other in nodes:
            other.store.put(cid, envelope)
        out[node.peer] = (cid, open_score_record(envelope, run=RUN, round_=1, signer=node.peer))
    return out


def _agree(node: NodeTrainer, headers: dict, seed: bytes, records: dict) -> SpreadScores:
    members = sorted(headers)
    cids = {m: c for m, (c, _) in headers.items()}
    common = SpreadRecords(RUN, 1, members, cids, node.state_cid, seed, records)
    assert node.scoring is not None
    recomputed = {}
    for target in disputed_targets(common):
        update = load_update(
            node.store, headers[target][1].update, peer=target, codec=CONFIG.update_codec,
            shapes=node.state,
        )  # fmt: skip
        recomputed[target] = TargetLosses(
            headers[target][0], *node.scoring.measure(1, seed, node.state, target, update)
        )
    return resolve_scores(
        common,
        reputation=node.scoring.reputation,
        recompute=recomputed.__getitem__,
    )


@pytest.mark.slow
def test_spread_scores_agree_name_a_lying_scorer_and_replay_bit_for_bit(tmp_path: Path) -> None:
    nodes = [_node(tmp_path, i, CONFIG, "flipped_tokens" if i == 0 else None) for i in range(4)]
    attacker = nodes[0].peer
    own = [n.train(1) for n in nodes]
    headers = _share(nodes, own)
    seed = score_seed(str(c) for c, _ in headers.values())
    honest_target = next(n.peer for n in nodes[1:])
    liar = scorers_of(RUN, 1, sorted(headers))[honest_target][0]
    records = _records(nodes, headers, seed, liar, honest_target)

    spreads = [_agree(node, headers, seed, records) for node in nodes]
    assert len({(s.admitted, tuple(s.reputation.items())) for s in spreads}) == 1
    spread = spreads[0]
    assert attacker not in spread.inputs
    assert spread.left_out[attacker].startswith("left out by scores: ")
    assert honest_target in spread.admitted  # the lie did not keep it out
    assert [b.peer for b in spread.wrong] == [liar]
    assert spread.wrong[0].update_cid == str(records[liar][0])

    parts = 3
    results = {}
    for p in range(parts):
        node = nodes[p + 1]
        inputs = {m: h for m, h in headers.items() if m in spread.inputs}
        missing = {m: spread.left_out[m] for m in headers if m not in spread.inputs}
        envelope, result = node.aggregate_partition(
            1, inputs, partition=p, parts=parts, missing=missing,  # type: ignore[arg-type]
        )  # fmt: skip
        assert attacker in result.missing and attacker not in result.inputs
        results[p] = (node.store.put_new(envelope, 0x71), result)
    for a in nodes:
        for b in nodes:
            if a is not b:
                _copy_all(a.store, b.store)
    # A node-local fact: one node never got the (left-out) attacker's header block. Its
    # checkpoint must still be the others' (specs/manifest.md#checkpoint-determinism).
    nodes[2].store.delete(headers[attacker][0])
    outputs = {p: r.output for p, (_, r) in results.items()}
    outcomes = [
        n.apply_partitions(1, results, outputs, parts=parts, dropped={}, scores=spread)
        for n in nodes
    ]
    assert len({n.state_cid for n in nodes}) == 1
    for outcome in outcomes:
        assert attacker not in outcome.members
        assert [b.peer for b in outcome.bans] == [liar]  # one round: no reputation ban yet
    assert nodes[1].scoring is not None and nodes[1].scoring.reputation == spread.reputation

    manifest = nodes[1].store_checkpoint()
    assert {n.store_checkpoint() for n in nodes if n is not nodes[1]} == {manifest}  # all agree
    verifier = BlockStore(tmp_path / "verifier")
    _copy_all(nodes[1].store, verifier)
    report = replay_checkpoint(verifier, manifest)
    assert report.state_cid == nodes[1].state_cid

    # The score records are part of what a checkpoint needs: without one, no replay.
    honest = scorers_of(RUN, 1, sorted(headers))[honest_target][1]
    verifier.delete(records[honest][0])
    with pytest.raises(CatchUpError, match=f"{records[honest][0]} is not available"):
        replay_checkpoint(verifier, manifest)


@pytest.mark.slow
def test_a_member_whose_header_nobody_has_is_left_out_and_the_checkpoint_still_verifies(
    tmp_path: Path,
) -> None:
    # A member told the coordinator a header CID whose block nobody can serve: its scorers say
    # why, it is not scored, not listed, and the seed (over the round record's CIDs) is recorded.
    nodes = [_node(tmp_path, i, CONFIG) for i in range(3)]
    ghost = Identity.generate().peer_id_str
    own = [n.train(1) for n in nodes]
    headers = _share(nodes, own)
    header_cids = {m: c for m, (c, _) in headers.items()}
    header_cids[ghost] = compute_cid(b"a header nobody holds", DAG_CBOR)
    members = sorted(header_cids)
    seed = score_seed(str(c) for c in header_cids.values())
    records = {}
    for node in nodes:
        assert node.scoring is not None
        scores, unscored = {}, {}
        for target in targets_of(RUN, 1, members, node.peer):
            if target == ghost:
                unscored[target] = "update not fetched: no holder answered"
                continue
            cid, header = headers[target]
            update = load_update(node.store, header.update, peer=target,
                                 codec=CONFIG.update_codec, shapes=node.state)  # fmt: skip
            scores[target] = TargetLosses(
                cid, *node.scoring.measure(1, seed, node.state, target, update)
            )
        envelope = seal_score_record(
            node.identity, ScoreRecord(RUN, 1, node.peer, node.state_cid, seed, scores, unscored)
        )
        cid = score_record_cid(envelope)
        for other in nodes:
            other.store.put(cid, envelope)
        records[node.peer] = (cid, open_score_record(envelope, run=RUN))
    spread = resolve_scores(
        SpreadRecords(run=RUN, round_=1, members=members, headers=header_cids,
                    base=nodes[0].state_cid, seed=seed, records=records),
        reputation={}, recompute=lambda t: pytest.fail(t),
    )  # fmt: skip
    assert ghost not in spread.inputs and spread.left_out[ghost].startswith("not scored")
    assert spread.to_params()["headers"][ghost] == str(header_cids[ghost])
    inputs = {m: h for m, h in headers.items() if m in spread.inputs}
    envelope, result = nodes[0].aggregate_partition(
        1, inputs, partition=0, parts=1, missing={ghost: spread.left_out[ghost]},  # type: ignore[arg-type]
    )  # fmt: skip
    results = {0: (nodes[0].store.put_new(envelope, DAG_CBOR), result)}
    for node in nodes[1:]:
        _copy_all(nodes[0].store, node.store)
    for node in nodes:
        node.apply_partitions(1, results, {0: result.output}, parts=1, dropped={}, scores=spread)
    assert len({n.state_cid for n in nodes}) == 1
    manifest = nodes[1].store_checkpoint()
    info = read_training_checkpoint(nodes[1].store, manifest)
    assert header_cids[ghost] not in info.headers  # only signed records that open are listed
    signed = check_signed_updates(nodes[1].store, info.manifest)
    assert signed.faults == () and signed.absent == 0
    verifier = BlockStore(tmp_path / "verifier")
    _copy_all(nodes[1].store, verifier)
    assert replay_checkpoint(verifier, manifest).state_cid == nodes[1].state_cid
