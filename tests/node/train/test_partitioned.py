"""Partitioned aggregation without the network (specs/training.md#partitioned-rounds).

Real block stores, signatures, torch training and aggregation; nodes exchange blocks by copying
them. Covers: a partitioned round with the plain mean gives the full round's state bit for bit;
every node assembles the same state from the same results; a signed result survives its
encoding and a forged one is refused with the reason; a wrong result is proved wrong by its
evidence CAR and a right one is not; evidence that is not what it claims is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cnode.auth import Identity
from cnode.node.train import PartitionEvidenceError, PeerUpdateError, TrainingConfig
from cnode.node.train._round import open_update_header
from cnode.node.train._trainer import NodeTrainer, OwnUpdate
from cnode.node.train.partition._evidence import (
    build_partition_evidence,
    check_partition_evidence,
    model_numel,
)
from cnode.node.train.partition._result import (
    open_partition_result,
    partition_result_cid,
    seal_partition_result,
)
from cnode.storage import BlockStore, manifest_closure

MEAN = TrainingConfig.from_dict({"local_steps": 1, "batch_size": 2, "aggregator": "mean"})
RUN = "r1"


def _node(tmp_path: Path, i: int, config: TrainingConfig, attack: str | None = None) -> NodeTrainer:
    return NodeTrainer(
        config, run=RUN, identity=Identity.generate(), store=BlockStore(tmp_path / f"n{i}"),
        attack=attack,
    )  # fmt: skip


def _share(nodes: list[NodeTrainer], own: list[OwnUpdate]) -> dict[str, tuple[object, object]]:
    """Every node gets every update's blocks and header; the headers, keyed by member."""
    headers = {}
    for o in own:
        src = next(n for n in nodes if n.peer == o.header.peer)
        for node in nodes:
            for cid in manifest_closure(src.store, o.header.update):
                if not node.store.has(cid):
                    node.store.put(cid, src.store.get(cid))
            node.store.put(o.header_cid, o.envelope)
        header = open_update_header(o.envelope, run=RUN, round_=1, signer=src.peer)
        headers[src.peer] = (o.header_cid, header)
    return headers


def _copy_all(src: BlockStore, dst: BlockStore) -> None:
    for cid in src.iter_cids():
        if not dst.has(cid):
            dst.put(cid, src.get(cid))


def _partitioned_round(nodes: list[NodeTrainer], parts: int) -> dict[int, tuple[object, object]]:
    own = [n.train(1) for n in nodes]
    headers = _share(nodes, own)
    results = {}
    for p in range(parts):
        node = nodes[p]
        envelope, result = node.aggregate_partition(
            1,
            headers,
            partition=p,
            parts=parts,
            missing={},  # type: ignore[arg-type]
        )
        cid = partition_result_cid(envelope)
        node.store.put(cid, envelope)
        results[p] = (cid, result)
    for a in nodes:
        for b in nodes:
            if a is not b:
                _copy_all(a.store, b.store)
    return results


@pytest.mark.slow
def test_partitioned_mean_equals_full_mean_bit_for_bit(tmp_path: Path) -> None:
    full = [_node(tmp_path / "full", i, MEAN) for i in range(4)]
    part = [_node(tmp_path / "part", i, MEAN) for i in range(4)]
    for f, p in zip(full, part, strict=True):
        p.identity, p.peer = f.identity, f.peer  # the same peers train the same batches
    own = [n.train(1) for n in full]
    headers = _share(full, own)
    expected = full[0].aggregate(1, headers, {})  # type: ignore[arg-type]

    results = _partitioned_round(part, 4)
    outputs = {p: r.output for p, (_, r) in results.items()}  # type: ignore[attr-defined]
    states = set()
    for node in part:
        outcome = node.apply_partitions(1, results, outputs, parts=4, dropped={})  # type: ignore[arg-type]
        states.add(str(node.state_cid))
        assert outcome.members == tuple(sorted(n.peer for n in part))
    assert states == {str(expected.result.state_cid)}


@pytest.mark.slow
def test_signed_result_round_trips_and_forgeries_are_refused(tmp_path: Path) -> None:
    nodes = [_node(tmp_path, i, MEAN) for i in range(3)]
    results = _partitioned_round(nodes, 3)
    cid, result = results[1]
    envelope = nodes[0].store.get(cid)  # type: ignore[arg-type]
    opened = open_partition_result(envelope, run=RUN, round_=1, signer=nodes[1].peer)
    assert opened == result
    with pytest.raises(PeerUpdateError, match="signed by"):
        open_partition_result(envelope, run=RUN, round_=1, signer=nodes[0].peer)
    with pytest.raises(PeerUpdateError, match=r"for round 1"):
        open_partition_result(envelope, run=RUN, round_=2)
    with pytest.raises(ValueError, match="signed by the aggregator it names"):
        seal_partition_result(nodes[0].identity, result)  # type: ignore[arg-type]


@pytest.mark.slow
def test_wrong_result_is_proved_wrong_by_its_evidence(tmp_path: Path) -> None:
    nodes = [
        _node(tmp_path, i, MEAN, attack="wrong_partition" if i == 2 else None) for i in range(3)
    ]
    results = _partitioned_round(nodes, 3)
    numel = model_numel(MEAN)
    training = MEAN.to_dict()
    for p, (cid, result) in results.items():
        car = build_partition_evidence(nodes[0].store, cid, numel=numel)  # type: ignore[arg-type]
        verdict = check_partition_evidence(
            car, str(cid), run=RUN, round_=1, partition=p, training=training
        )
        assert verdict.signer == result.peer  # type: ignore[attr-defined]
        assert verdict.correct == (p != 2), verdict
        if p == 2:
            assert verdict.claimed != verdict.recomputed
    cid, _ = results[0]
    car = build_partition_evidence(nodes[0].store, cid, numel=numel)  # type: ignore[arg-type]
    with pytest.raises(PartitionEvidenceError, match="not 1"):
        check_partition_evidence(car, str(cid), run=RUN, round_=1, partition=1, training=training)
    with pytest.raises(PartitionEvidenceError, match="root"):
        other, _ = results[1]
        check_partition_evidence(car, str(other), run=RUN, round_=1, partition=0, training=training)
    with pytest.raises(PartitionEvidenceError, match=r"unreadable|truncated"):
        check_partition_evidence(
            car[:-7], str(cid), run=RUN, round_=1, partition=0, training=training
        )
    tampered = bytearray(car)
    tampered[-3] ^= 0xFF
    with pytest.raises(PartitionEvidenceError, match="evidence block"):
        check_partition_evidence(
            bytes(tampered), str(cid), run=RUN, round_=1, partition=0, training=training
        )
    short = car[: len(car) // 2]
    with pytest.raises(PartitionEvidenceError):
        check_partition_evidence(short, str(cid), run=RUN, round_=1, partition=0, training=training)


@pytest.mark.slow
def test_a_partitioned_checkpoint_replays(tmp_path: Path) -> None:
    from cnode.node.train import replay_checkpoint

    nodes = [_node(tmp_path, i, MEAN) for i in range(3)]
    results = _partitioned_round(nodes, 3)
    outputs = {p: r.output for p, (_, r) in results.items()}  # type: ignore[attr-defined]
    for node in nodes:
        node.apply_partitions(1, results, outputs, parts=3, dropped={})  # type: ignore[arg-type]
    manifest = nodes[0].store_checkpoint()
    _copy_all(nodes[0].store, nodes[1].store)
    report = replay_checkpoint(nodes[1].store, manifest)
    assert report.rounds == (1,) and report.state_cid == nodes[0].state_cid


def test_scores_go_with_every_partition_mode_and_bad_modes_are_refused() -> None:
    from cnode.node.train import TrainingConfigError

    for mode in ("never", "auto", "always"):  # scores are spread in partitioned rounds
        assert TrainingConfig.from_dict({"scores": True, "partitioned": mode}).scores
    # A run config's table scores unless it says not to; a recorded one without the key is of a
    # run from before scores (its checkpoints replay as they were made).
    assert TrainingConfig.for_run({}).scores
    assert not TrainingConfig.for_run({"scores": False}).scores
    assert not TrainingConfig.from_dict({}).scores
    with pytest.raises(TrainingConfigError, match="must be a table"):
        TrainingConfig.for_run([])  # type: ignore[arg-type]
    with pytest.raises(TrainingConfigError, match=re.escape("training.partitioned 'sometimes'")):
        TrainingConfig.from_dict({"partitioned": "sometimes"})
    with pytest.raises(TrainingConfigError, match=re.escape("verify_partitions must be 0..64")):
        TrainingConfig.from_dict({"verify_partitions": 65})


def test_a_round_in_which_nothing_was_exchanged_is_no_progress(tmp_path: Path) -> None:
    # Every partition kept its parent (no result recorded): the state stays, the round is not
    # logged for a checkpoint, and the outcome says so (the loop warns and stores nothing).
    node = _node(tmp_path, 0, MEAN)
    before = node.state_cid
    outcome = node.apply_partitions(1, {}, {0: None, 1: None}, parts=2, dropped={})
    assert outcome.empty and outcome.members == ()
    assert node.round == 1 and node.state_cid == before
    assert node.since_checkpoint == []
