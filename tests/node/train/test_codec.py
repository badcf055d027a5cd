"""Compressed updates in a round (specs/training.md#update-codecs, #error-feedback).

Real block stores, signatures and aggregator; nodes exchange blocks by copying them, as in
test_round.py. Covers: an int8-blockwise swarm agrees bit for bit and replays; the update manifest
records the codec under the signed CID; malformed or foreign-codec updates are left out with a
reason and reported as ban evidence; the quantization residual is carried to the next round,
kept across a restart and dropped on catch-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cnode.aggregation import EvidenceKind
from cnode.auth import Identity
from cnode.node.cli import main
from cnode.node.train import (
    MalformedUpdateError,
    TrainingConfig,
    TrainingConfigError,
    replay_checkpoint,
)
from cnode.node.train._round import (
    encode_update,
    load_update,
    store_update,
)
from cnode.node.train._trainer import NodeTrainer, OwnUpdate
from cnode.storage import BlockStore, read_manifest
from tests.support.trainers import exchange_updates

INT8 = TrainingConfig.from_dict(
    {"local_steps": 2, "batch_size": 4, "update_codec": "int8-blockwise"}
)


def _node(tmp_path: Path, i: int, config: TrainingConfig = INT8, **kw: object) -> NodeTrainer:
    identity = kw.pop("identity", None) or Identity.generate()
    return NodeTrainer(
        config,
        run="r1",
        identity=identity,
        store=BlockStore(tmp_path / f"n{i}"),
        **kw,  # type: ignore[arg-type]
    )


def test_update_codec_must_be_known() -> None:
    assert TrainingConfig().update_codec == "f32"  # what a table without the key has meant
    with pytest.raises(TrainingConfigError, match="update_codec 'int4' is not one of"):
        TrainingConfig.from_dict({"update_codec": "int4"})


@pytest.mark.slow
def test_int8_swarm_agrees_bit_for_bit_and_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [_node(tmp_path, i) for i in range(3)]
    for round_ in (1, 2):
        own = [n.train(round_) for n in nodes]
        manifest = read_manifest(nodes[0].store, own[0].header.update)
        assert manifest.extra["codec"] == "int8-blockwise"
        assert {layer.dtype for layer in manifest.layers} == {"uint8"}
        exchange_updates(nodes, own, round_)
        assert len({n.state_cid for n in nodes}) == 1
    cids = {n.store_checkpoint() for n in nodes}
    assert len(cids) == 1
    checkpoint = cids.pop()
    report = replay_checkpoint(nodes[0].store, checkpoint)
    assert report.rounds == (1, 2) and report.state_cid == nodes[0].state_cid
    # The command a user runs: verify every block and signature, then replay the decoded rounds.
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(f'storage_path = "{nodes[0].store.root}"\n')
    assert main(["checkpoint", "verify", "--replay", str(checkpoint), "--home", str(home)]) == 0
    assert "replay OK: rounds 1..2 recomputed" in capsys.readouterr().out


def test_bf16_updates_decode_to_their_rounded_values(tmp_path: Path) -> None:
    config = TrainingConfig.from_dict({"local_steps": 1, "batch_size": 2, "update_codec": "bf16"})
    node = _node(tmp_path, 0, config)
    own = node.train(1)
    got = load_update(node.store, own.header.update, peer="p", codec="bf16", shapes=node.state)
    assert all(t.dtype == torch.float32 for t in got.values())
    assert node.residual is not None
    for tensor in got.values():
        assert torch.equal(tensor, tensor.to(torch.bfloat16).to(torch.float32))


def test_malformed_and_foreign_codec_updates_are_left_out_and_reported(tmp_path: Path) -> None:
    nodes = [_node(tmp_path, i) for i in range(4)]
    own = [n.train(1) for n in nodes[:2]]
    # Node 2 sends an f32 update in an int8 run; node 3 an int8 layer cut one byte short.
    shapes = nodes[2].state
    f32 = {k: torch.zeros_like(t) for k, t in shapes.items()}
    short = [e[:-1] for e in encode_update(f32, "int8-blockwise")[0]]
    for bad, (segments, codec) in enumerate(
        [(encode_update(f32, "f32")[0], "f32"), (short, "int8-blockwise")], start=2
    ):
        node = nodes[bad]
        cid = store_update(
            node.store, segments, run="r1", round_=1, base=node.state_cid, codec=codec
        )
        with pytest.raises(MalformedUpdateError):
            load_update(node.store, cid, peer=node.peer, codec="int8-blockwise", shapes=shapes)
        own.append(_forge(node, cid))
    outcomes = exchange_updates(nodes, own, 1)
    honest = outcomes[0]
    dropped = honest.dropped  # type: ignore[attr-defined]
    assert "encoded with 'f32', the run uses 'int8-blockwise'" in dropped[nodes[2].peer]
    assert "expected" in dropped[nodes[3].peer] and "length" in dropped[nodes[3].peer]
    assert honest.members == tuple(sorted(n.peer for n in nodes[:2]))  # type: ignore[attr-defined]
    banned = {b.peer: b for b in honest.bans}  # type: ignore[attr-defined]
    assert set(banned) == {nodes[2].peer, nodes[3].peer}
    assert banned[nodes[3].peer].kind is EvidenceKind.REJECTED
    assert banned[nodes[3].peer].update_cid == str(own[3].header.update)
    assert len({n.state_cid for n in nodes}) == 1  # every node leaves out the same ones


def _forge(node: NodeTrainer, cid: object) -> OwnUpdate:
    """A signed header naming ``cid`` (what a faulty peer publishes)."""
    from cnode.node.train._round import UpdateHeader, header_cid, seal_update_header

    header = UpdateHeader("r1", 1, node.peer, 8, cid, node.state_cid)  # type: ignore[arg-type]
    envelope = seal_update_header(node.identity, header)
    node.store.put(header_cid(envelope), envelope)
    return OwnUpdate(1, header, envelope, header_cid(envelope), None, 0.0)  # type: ignore[arg-type]


@pytest.mark.slow
def test_residual_is_carried_kept_across_restart_and_dropped_on_catch_up(tmp_path: Path) -> None:
    identity = Identity.generate()
    node = _node(tmp_path, 0, identity=identity)
    other = _node(tmp_path, 1)
    own = [node.train(1), other.train(1)]
    assert node.residual is not None and node.residual.round == 1
    residual_1 = {k: t.clone() for k, t in node.residual.tensors.items()}
    assert max(float(t.abs().max()) for t in residual_1.values()) > 0
    exchange_updates([node, other], own, 1)

    # Carried: round 2's update is encode(delta_2 + residual_1); the new residual is what that
    # encoding left out, so sent_1 + sent_2 + residual_2 == delta_1 + delta_2 exactly.
    own2 = node.train(2)
    sent = load_update(
        node.store, own2.header.update, peer=node.peer, codec="int8-blockwise", shapes=node.state
    )
    delta2 = own2.local.delta
    for name in residual_1:
        total = delta2[name] + residual_1[name]
        assert torch.allclose(sent[name] + node.residual.tensors[name], total, atol=1e-7)  # type: ignore[union-attr]
    assert node.residual is not None and node.residual.round == 2
    exchange_updates([node, other], [own2, other.train(2)], 2)
    checkpoint = node.store_checkpoint()
    other.store_checkpoint()
    kept = {k: t.clone() for k, t in node.residual.tensors.items()}

    # Restart with the same home: the pinned checkpoint (round 2) and the round-2 residual.
    again = _node(tmp_path, 0, identity=identity)
    assert again.residual is None
    again.resume_checkpoint(checkpoint)
    assert again.round == 2 and again.residual is not None and again.residual.round == 2
    assert all(torch.equal(again.residual.tensors[k], kept[k]) for k in kept)

    # Catch-up (adopting a checkpoint fetched from the swarm) drops it, on disk too.
    again.adopt_checkpoint(checkpoint)
    assert again.residual is None
    third = _node(tmp_path, 0, identity=identity)
    third.resume_checkpoint(checkpoint)
    assert third.residual is None


def test_a_residual_of_another_round_is_not_resumed(tmp_path: Path) -> None:
    identity = Identity.generate()
    node = _node(tmp_path, 0, identity=identity)
    node.store_checkpoint()  # round 0
    genesis = node.checkpoint
    node.train(1)  # residual of round 1; the node then crashes before aggregating
    assert node.residual is not None
    again = _node(tmp_path, 0, identity=identity)
    again.resume_checkpoint(genesis)  # type: ignore[arg-type]
    assert again.round == 0 and again.residual is None


def test_error_decay_is_checked_and_recorded_only_when_not_1() -> None:
    assert TrainingConfig().error_decay == 1.0
    assert "error_decay" not in INT8.to_dict()  # older runs keep their recorded bytes
    decayed = TrainingConfig.from_dict({**INT8.to_dict(), "error_decay": 0.95})
    assert decayed.to_dict()["error_decay"] == 0.95
    assert TrainingConfig.from_dict(decayed.to_dict()) == decayed
    for bad in (-0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(
            TrainingConfigError, match=r"training\.error_decay .* must be in \[0, 1\]"
        ):
            TrainingConfig.from_dict({**INT8.to_dict(), "error_decay": bad})
    with pytest.raises(TrainingConfigError, match=r"error_decay must be float, got 'x'"):
        TrainingConfig.from_dict({**INT8.to_dict(), "error_decay": "x"})
    with pytest.raises(TrainingConfigError, match=r"error_decay is for lossy codecs"):
        TrainingConfig.from_dict({"error_decay": 0.5})  # f32 keeps no residual


def test_error_decay_scales_the_residual_it_carries(tmp_path: Path) -> None:
    config = TrainingConfig.from_dict({**INT8.to_dict(), "error_decay": 0.5})
    node, other = _node(tmp_path, 0, config), _node(tmp_path, 1, config)
    exchange_updates([node, other], [node.train(1), other.train(1)], 1)
    assert node.residual is not None
    residual_1 = {k: t.clone() for k, t in node.residual.tensors.items()}
    own2 = node.train(2)
    sent = load_update(
        node.store, own2.header.update, peer=node.peer, codec="int8-blockwise", shapes=node.state
    )
    half = torch.tensor(0.5, dtype=torch.float32)
    assert node.residual is not None
    for name, delta in own2.local.delta.items():
        encoded = delta + residual_1[name] * half  # e <- beta e + delta, then encoded
        assert torch.allclose(sent[name] + node.residual.tensors[name], encoded, atol=1e-7)
    # Not what decay 1 would have sent: the old error counts half.
    assert any(
        not torch.allclose(sent[n] + node.residual.tensors[n], d + residual_1[n], atol=1e-6)
        for n, d in own2.local.delta.items()
    )


def test_the_decayed_residual_is_the_same_bits_on_any_thread_count() -> None:
    import numpy as np

    from cnode.node.train.model import Residual, with_residual

    gen = torch.Generator().manual_seed(5)
    delta = {"w": torch.randn(70_001, generator=gen), "b": torch.randn(3, generator=gen)}
    residual = Residual(1, {k: torch.randn(t.shape, generator=gen) for k, t in delta.items()})
    before, outs = torch.get_num_threads(), []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(with_residual(delta, residual, 0.95))
    finally:
        torch.set_num_threads(before)
    for name, t in delta.items():
        # Two exactly rounded float32 operations, as numpy's scalar-free float32 arithmetic.
        expect = t.numpy() + residual.tensors[name].numpy() * np.float32(0.95)
        for out in outs:
            assert out[name].numpy().tobytes() == expect.tobytes()
    same = with_residual(delta, residual, 1.0)
    assert all(torch.equal(same[k], delta[k] + residual.tensors[k]) for k in delta)
