"""``cnode checkpoint verify --replay``: recompute a checkpoint from the signed updates it names.

Checkpoints come from real NodeTrainers (real stores, signatures, aggregation) playing rounds
without the network, as in test_round.py; the replay over the network fetches from a real
``cnode checkpoint serve`` process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cnode.node.cli import main
from cnode.node.train._trainer import NodeTrainer
from cnode.storage import (
    CID,
    DAG_CBOR,
    AggregationRecord,
    BlockStore,
    CheckpointMeta,
    load_checkpoint,
    read_manifest,
    read_tokenizer_files,
    save_checkpoint,
)
from tests.support.procs import procs
from tests.support.trainers import play_full_round

from .test_round import _swarm

pytestmark = pytest.mark.slow


def _trained(tmp_path: Path) -> tuple[list[NodeTrainer], CID, CID]:
    """Three nodes play rounds 1..3 with a checkpoint after 1 and after 3; (nodes, first, last)."""
    nodes = _swarm(tmp_path / "nodes", 3)
    play_full_round(nodes, 1)
    first = {node.store_checkpoint() for node in nodes}.pop()
    play_full_round(nodes, 2)
    play_full_round(nodes, 3)
    last = {node.store_checkpoint() for node in nodes}.pop()
    return nodes, first, last


def _home_of(store: BlockStore, tmp_path: Path, name: str) -> Path:
    """A node home whose block store is ``store`` (config.toml points at it)."""
    home = tmp_path / name
    home.mkdir()
    (home / "config.toml").write_text(f'storage_path = "{store.root}"\n')
    return home


def test_replay_of_a_local_checkpoint_and_of_a_forged_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, first, last = _trained(tmp_path)
    home = _home_of(nodes[0].store, tmp_path, "h0")
    assert main(["checkpoint", "verify", "--replay", str(last), "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert "replay OK: rounds 2..3 recomputed from " + str(first) in out
    assert "all " in out and "layers have the manifest's CIDs" in out
    assert "6 signed update headers: signature, run and round OK" in out

    # Another node changes one layer of its state and checkpoints it: replay names the layer.
    forger = nodes[1]
    bad = sorted(forger.state)[2]
    forger.state = {**forger.state, bad: forger.state[bad] + 0.5}
    forged = forger.store_checkpoint()
    home1 = _home_of(forger.store, tmp_path, "h1")
    args = ["checkpoint", "verify", "--replay", str(forged), "--home", str(home1), "--json"]
    assert main(args) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True  # every block is there and hashes right ...
    assert report["replay"]["ok"] is False  # ... but the state is not what the updates give
    assert report["replay"]["layer"] == bad
    assert f"layer {bad} differs" in report["replay"]["message"]


def test_replay_fetches_parent_headers_and_updates_from_a_peer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, first, last = _trained(tmp_path)
    fresh = tmp_path / "verifier"
    # Without a peer, the verifier holds nothing and says what to do.
    assert main(["checkpoint", "verify", "--replay", str(last), "--home", str(fresh)]) == 1
    assert "manifest-missing" in capsys.readouterr().out

    holder_home = _home_of(nodes[2].store, tmp_path, "holder")
    with procs(tmp_path) as running:
        _, address = running.holder(holder_home, "--open")
        args = ["checkpoint", "verify", "--replay", str(last), "--home", str(fresh)]
        assert main([*args, "--peer", address]) == 0
    out = capsys.readouterr().out
    assert "replay OK: rounds 2..3 recomputed from " + str(first) in out
    fetched = int(out.split("fetched ", 1)[1].split(" ", 1)[0])
    assert fetched > 0
    # what the replay needed is now held: a second run needs no peer
    assert main(args) == 0


def test_replay_refuses_a_car_and_a_peer_without_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    car = tmp_path / "x.car"
    car.write_bytes(b"")
    assert main(["checkpoint", "verify", "--replay", str(car), "--home", str(tmp_path)]) == 1
    assert "import the CAR first" in capsys.readouterr().err
    cid = "bafyreigsmzorphngqd5vcsdjnfwzkvczy4t3agavu3zm2wcze4wuvifebm"
    args = ["checkpoint", "verify", cid, "--peer", "/ip4/127.0.0.1/tcp/1", "--home", str(tmp_path)]
    assert main(args) == 1
    assert "--peer is for --replay" in capsys.readouterr().err


def test_verify_checks_the_signatures_of_the_headers_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, _, last = _trained(tmp_path)
    store = nodes[0].store
    home = _home_of(store, tmp_path, "h0")
    assert main(["checkpoint", "verify", str(last), "--home", str(home)]) == 0
    assert "6 signed update headers" in capsys.readouterr().out
    # Replace one header block by one whose signature is broken (same CID: planted on disk,
    # as a corrupt peer or disk would; storage sees the hash mismatch, the CLI the signature).
    manifest = read_manifest(store, last)
    assert manifest.aggregation is not None
    header = manifest.aggregation.updates[0]
    envelope = bytearray(store.get(header))
    envelope[-5] ^= 0x01  # inside the signature
    forged = store.put_new(bytes(envelope), DAG_CBOR)
    record = AggregationRecord(
        manifest.aggregation.aggregator,
        manifest.aggregation.params,
        [forged, *manifest.aggregation.updates[1:]],
    )
    tensors, _ = load_checkpoint(store, last)
    meta = CheckpointMeta(
        run_id=manifest.run_id,
        kind=manifest.kind,
        epoch=manifest.epoch,
        round=manifest.round,
        step=manifest.step,
        parent=manifest.parent,
        model_config=manifest.model_config,
        tokenizer_files=read_tokenizer_files(store, manifest),
        aggregation=record,
        extra=manifest.extra,
    )
    bad = save_checkpoint(store, tensors, meta)
    assert main(["checkpoint", "verify", str(bad), "--home", str(home), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(f["kind"], f["cid"]) for f in report["faults"]] == [("update-signature", str(forged))]
