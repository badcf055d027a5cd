"""Sparse updates downstream (specs/training.md#update-codecs): a sparse-topk run, without the
network, as test_codec.py and test_partition_scores.py do it. Covers: the update manifest records
``sparse-topk:K`` and holds about 1/100 of f32; a full-replication swarm agrees bit for bit and
``cnode checkpoint verify --replay`` rebuilds the state CID; a partitioned round with scores (the
reputation, admission and CenteredClip on the admitted inputs) agrees, its partition results
travel as ``sparse-int8:2K`` and a replay of its checkpoint rebuilds the state CID; a malformed
sparse update is left out with the reason and reported as ban evidence, like NaN."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cnode.aggregation import encoded_nbytes, score_seed, segment_ranges
from cnode.node.cli import main
from cnode.node.train import TrainingConfig, replay_checkpoint
from cnode.node.train._round import encode_update, load_update, store_update
from cnode.node.train.scores._records import (
    ScoreRecord,
    TargetLosses,
    open_score_record,
    score_record_cid,
    seal_score_record,
)
from cnode.node.train.scores._spread import SpreadRecords, resolve_scores, targets_of
from cnode.storage import BlockStore, read_manifest
from tests.support.trainers import exchange_updates

from .test_codec import _forge
from .test_codec import _node as _codec_node
from .test_partitioned import RUN, _copy_all, _node, _share

TINY = {
    "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32},
    "data": {"seq_len": 32, "eval_sequences": 16},
    "batch_size": 4,
    "update_codec": "sparse-topk",
}
FULL = TrainingConfig.from_dict({**TINY, "local_steps": 2})
SCORED = TrainingConfig.from_dict(
    {**TINY, "local_steps": 4, "lr": 0.01, "scores": True, "partitioned": "always"}
)


def test_the_run_records_k_and_the_result_codec_and_checks_the_density() -> None:
    assert FULL.wire_codec == "sparse-topk:64" and FULL.result_codec == "sparse-int8:128"
    assert FULL.to_dict()["update_density"] == 1 / 64
    assert "update_density" not in TrainingConfig().to_dict()  # other runs keep their bytes
    with pytest.raises(Exception, match=r"training\.update_density: .* not in \(0, 1\]"):
        TrainingConfig.from_dict({**TINY, "update_density": 0.0})


@pytest.mark.slow
def test_sparse_swarm_agrees_and_verify_replay_rebuilds_the_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [_codec_node(tmp_path, i, FULL) for i in range(3)]
    numel = sum(t.numel() for t in nodes[0].state.values())
    for round_ in (1, 2):
        own = [n.train(round_) for n in nodes]
        manifest = read_manifest(nodes[0].store, own[0].header.update)
        assert manifest.extra["codec"] == "sparse-topk:64"
        stored = sum(layer.nbytes for layer in manifest.layers)
        most = sum(encoded_nbytes(b - a, "sparse-topk:64") for a, b in segment_ranges(numel))
        assert stored <= most <= 0.0073 * 4 * numel + 64 * 8  # + a header per segment
        exchange_updates(nodes, own, round_)
        assert len({n.state_cid for n in nodes}) == 1
    assert nodes[0].residual is not None and nodes[0].residual.round == 2
    checkpoint = nodes[0].store_checkpoint()
    assert {n.store_checkpoint() for n in nodes[1:]} == {checkpoint}
    assert replay_checkpoint(nodes[0].store, checkpoint).state_cid == nodes[0].state_cid
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(f'storage_path = "{nodes[0].store.root}"\n')
    assert main(["checkpoint", "verify", "--replay", str(checkpoint), "--home", str(home)]) == 0
    assert "replay OK: rounds 1..2 recomputed" in capsys.readouterr().out


def test_a_malformed_sparse_update_is_left_out_and_reported(tmp_path: Path) -> None:
    nodes = [_codec_node(tmp_path, i, FULL) for i in range(3)]
    own = [n.train(1) for n in nodes[:2]]
    bad = nodes[2]
    segments, _ = encode_update(
        {k: torch.ones_like(t) for k, t in bad.state.items()}, "sparse-topk:64"
    )
    segments[0] = segments[0].clone()
    segments[0][4] = 13  # segment 0 (727 values, one short chunk) claims 13 values: its quota is 12
    cid = store_update(bad.store, segments, run="r1", round_=1, base=bad.state_cid,
                       codec="sparse-topk:64")  # fmt: skip
    own.append(_forge(bad, cid))
    honest = exchange_updates(nodes, own, 1)[0]
    why = honest.dropped[bad.peer]  # type: ignore[attr-defined]
    assert "segment 0: sparse-topk chunk 0 holds 13 values, more than its 12" in why
    assert bad.peer in {b.peer for b in honest.bans}  # type: ignore[attr-defined]
    assert len({n.state_cid for n in nodes}) == 1


@pytest.mark.slow
def test_partitioned_sparse_round_with_scores_agrees_and_replays(tmp_path: Path) -> None:
    nodes = [_node(tmp_path, i, SCORED) for i in range(4)]
    own = [n.train(1) for n in nodes]
    headers = _share(nodes, own)
    members = sorted(headers)
    seed = score_seed(str(c) for c, _ in headers.values())
    records = {}
    for node in nodes:
        assert node.scoring is not None
        scores = {}
        for target in targets_of(RUN, 1, members, node.peer):
            cid, header = headers[target]
            update = load_update(node.store, header.update, peer=target,  # type: ignore[attr-defined]
                                 codec=SCORED.wire_codec, shapes=node.state)  # fmt: skip
            scores[target] = TargetLosses(
                cid, *node.scoring.measure(1, seed, node.state, target, update)
            )  # type: ignore[arg-type]
        envelope = seal_score_record(
            node.identity, ScoreRecord(RUN, 1, node.peer, node.state_cid, seed, scores, {})
        )  # type: ignore[arg-type]
        cid = score_record_cid(envelope)
        for other in nodes:
            other.store.put(cid, envelope)
        records[node.peer] = (cid, open_score_record(envelope, run=RUN))
    spread = resolve_scores(
        SpreadRecords(RUN, 1, members, {m: c for m, (c, _) in headers.items()},  # type: ignore[misc]
                    nodes[0].state_cid, seed, records),
        reputation={}, recompute=lambda t: pytest.fail(t),
    )  # fmt: skip
    parts = 4
    results = {}
    for p in range(parts):
        inputs = {m: h for m, h in headers.items() if m in spread.inputs}
        missing = {m: spread.left_out[m] for m in headers if m not in spread.inputs}
        envelope, result = nodes[p].aggregate_partition(
            1, inputs, partition=p, parts=parts, missing=missing,  # type: ignore[arg-type]
        )  # fmt: skip
        assert read_manifest(nodes[p].store, result.output).extra["codec"] == "sparse-int8:128"
        results[p] = (nodes[p].store.put_new(envelope, 0x71), result)
    for a in nodes:
        for b in nodes:
            if a is not b:
                _copy_all(a.store, b.store)
    outputs = {p: r.output for p, (_, r) in results.items()}
    for n in nodes:
        n.apply_partitions(1, results, outputs, parts=parts, dropped={}, scores=spread)
    assert len({n.state_cid for n in nodes}) == 1
    assert nodes[0].scoring is not None and nodes[0].scoring.reputation == spread.reputation
    manifest = nodes[1].store_checkpoint()
    verifier = BlockStore(tmp_path / "verifier")
    _copy_all(nodes[1].store, verifier)
    assert replay_checkpoint(verifier, manifest).state_cid == nodes[1].state_cid
