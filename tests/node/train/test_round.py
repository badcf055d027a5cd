"""A round without the network: updates as blocks, signed headers, aggregation, checkpoints, replay.

Real block stores, real signatures, the real aggregator; several "nodes" are several NodeTrainers
with their own stores, exchanging blocks by copying them (what the block exchange does, verified).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cnode.auth import Identity, seal
from cnode.node.train import (
    PeerUpdateError,
    ReplayMismatchError,
    StateMismatchError,
    TrainingConfig,
    replay_checkpoint,
    state_cid,
)
from cnode.node.train._round import UPDATE_HEADER_TYPE, UpdateHeader, open_update_header
from cnode.node.train._trainer import NodeTrainer
from cnode.storage import BlockStore, load_checkpoint
from tests.support.trainers import play_full_round

CONFIG = TrainingConfig.from_dict({"local_steps": 2, "batch_size": 4})


def _swarm(tmp_path: Path, n: int, attack: dict[int, str] | None = None) -> list[NodeTrainer]:
    attack = attack or {}
    return [
        NodeTrainer(
            CONFIG,
            run="r1",
            identity=Identity.generate(),
            store=BlockStore(tmp_path / f"n{i}"),
            attack=attack.get(i),
        )
        for i in range(n)
    ]


@pytest.mark.slow
def test_honest_nodes_end_every_round_bit_identical(tmp_path: Path) -> None:
    nodes = _swarm(tmp_path, 3)
    for round_ in (1, 2):
        outcomes = play_full_round(nodes, round_)
        assert len({node.state_cid for node in nodes}) == 1
        assert all(o.members == tuple(sorted(n.peer for n in nodes)) for o in outcomes)  # type: ignore[attr-defined]
    cids = {node.store_checkpoint() for node in nodes}
    assert len(cids) == 1  # same manifest bytes on every node: each is a holder


@pytest.mark.slow
def test_checkpoint_replays_to_the_same_layers_and_names_a_tampered_layer(tmp_path: Path) -> None:
    nodes = _swarm(tmp_path, 3)
    play_full_round(nodes, 1)
    first = nodes[0].store_checkpoint()
    for node in nodes[1:]:
        node.store_checkpoint()
    play_full_round(nodes, 2)
    play_full_round(nodes, 3)
    second = nodes[0].store_checkpoint()
    report = replay_checkpoint(nodes[0].store, second)
    assert report.rounds == (2, 3) and report.parent == first
    assert report.state_cid == nodes[0].state_cid
    assert report.describe().startswith("replay OK: rounds 2..3 recomputed from ")
    # the genesis-parented first checkpoint replays from the seed
    assert replay_checkpoint(nodes[0].store, first).rounds == (1,)

    # A checkpoint whose tensors were changed in one layer: replay names that layer.
    tensors, _ = load_checkpoint(nodes[0].store, second)
    bad_name = sorted(tensors)[3]
    nodes[1].state = dict(nodes[1].state)
    nodes[1].state[bad_name] = nodes[1].state[bad_name] + 1.0
    forged = nodes[1].store_checkpoint()
    with pytest.raises(ReplayMismatchError, match=bad_name) as info:
        replay_checkpoint(nodes[1].store, forged)
    assert info.value.layer == bad_name


def test_an_attacker_is_clipped_rejected_or_recommended_for_a_ban(tmp_path: Path) -> None:
    nodes = _swarm(tmp_path, 5, attack={4: "gaussian"})
    attacker = nodes[4].peer
    bans = []
    for round_ in (1, 2, 3):
        outcomes = play_full_round(nodes, round_)
        honest = outcomes[0]
        record = honest.result.aggregation.records[attacker]  # type: ignore[attr-defined]
        assert record.outlier
        bans += honest.bans  # type: ignore[attr-defined]
    assert [b.peer for b in bans] == [attacker]
    assert bans[0].round == 3 and bans[0].figures["rounds"] == [1, 2, 3]


def test_nan_update_is_rejected_and_the_round_still_agrees(tmp_path: Path) -> None:
    nodes = _swarm(tmp_path, 4, attack={3: "nan"})
    outcomes = play_full_round(nodes, 1)
    assert len({n.state_cid for n in nodes[:3]}) == 1
    honest = outcomes[0]
    assert nodes[3].peer in honest.result.aggregation.rejected  # type: ignore[attr-defined]
    assert honest.bans[0].peer == nodes[3].peer  # type: ignore[attr-defined]
    assert all(torch.isfinite(t).all() for t in nodes[0].state.values())


def test_update_header_errors_name_the_fault(tmp_path: Path) -> None:
    node = _swarm(tmp_path, 1)[0]
    own = node.train(1)
    with pytest.raises(PeerUpdateError, match="not 'other'"):
        open_update_header(own.envelope, run="other")
    with pytest.raises(PeerUpdateError, match="round 1, not 2"):
        open_update_header(own.envelope, run="r1", round_=2)
    stranger = Identity.generate()
    with pytest.raises(PeerUpdateError, match="bad header envelope"):
        open_update_header(own.envelope, run="r1", signer=stranger.peer_id_str)
    lying = seal(stranger, UPDATE_HEADER_TYPE, own.header.to_payload())  # names another peer
    with pytest.raises(PeerUpdateError, match="another peer than its signer"):
        open_update_header(lying, run="r1")
    with pytest.raises(PeerUpdateError, match="MAX_UPDATE_HEADER_BYTES"):
        open_update_header(b"x" * 5000, run="r1")
    assert isinstance(open_update_header(own.envelope, run="r1"), UpdateHeader)


def test_a_node_whose_state_diverged_stops_at_the_next_round(tmp_path: Path) -> None:
    nodes = _swarm(tmp_path, 4)
    play_full_round(nodes, 1)
    odd = nodes[3]
    name = sorted(odd.state)[0]
    odd.state = {**odd.state, name: odd.state[name] + 1e-3}
    odd.state_cid = state_cid(odd.state)  # as if its aggregation had gone wrong
    own = {node.peer: node.train(2) for node in nodes}
    headers = {peer: o.header for peer, o in own.items()}
    # The three agreeing nodes see one member on another base: its fault, no error (it is
    # dropped from their aggregate, see aggregate()).
    for node in nodes[:3]:
        node.check_agreement(2, headers)
    # The diverged node sees all three others on another base: a loud error naming both.
    with pytest.raises(StateMismatchError, match="3 of 3 other members trained from state"):
        odd.check_agreement(2, headers)
