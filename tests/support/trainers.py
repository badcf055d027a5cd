"""Full rounds among in-process trainers, without the network: what the round's exchange does
between nodes (every update and signed header reaches every member), done by copying blocks
between their stores. Used by the unit tests of rounds, scores, codecs, devices and momentum."""

from __future__ import annotations

from collections.abc import Sequence

from cnode.node.train import NodeTrainer, TrainingConfig, open_update_header
from cnode.node.train._trainer import OwnUpdate, RoundOutcome
from cnode.storage import CID, BlockStore, manifest_closure

# The smallest model the unit tests train: one layer, 32 wide.
SMALL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32}


def tiny_config(*, scores: bool, **training: object) -> TrainingConfig:
    """A run's ``[training]`` table small enough for a unit test (two local steps of two
    sequences of 32 tokens, full replication), with ``training``'s keys on top."""
    table = {
        "model": SMALL,
        "data": {"seq_len": 32, "eval_sequences": 4},
        "local_steps": 2,
        "batch_size": 2,
        "partitioned": "never",
        "scores": scores,
        **training,
    }
    return TrainingConfig.for_run(table)


def copy_closure(src: BlockStore, dst: BlockStore, root: CID) -> None:
    """Copy every block of the manifest at ``root`` that ``dst`` lacks."""
    for cid in manifest_closure(src, root):
        if not dst.has(cid):
            dst.put(cid, src.get(cid))


def exchange_updates(
    nodes: Sequence[NodeTrainer], own: Sequence[OwnUpdate], round_: int
) -> list[RoundOutcome]:
    """Give every node each update in ``own`` (and its signed header); aggregate on each."""
    outcomes = []
    for node in nodes:
        headers = {}
        for o in own:
            src = next(n for n in nodes if n.peer == o.header.peer)
            copy_closure(src.store, node.store, o.header.update)
            node.store.put(o.header_cid, o.envelope)
            header = open_update_header(o.envelope, run="r1", round_=round_, signer=src.peer)
            headers[src.peer] = (o.header_cid, header)
        outcomes.append(node.aggregate(round_, headers, {}))
    return outcomes


def play_full_round(nodes: Sequence[NodeTrainer], round_: int) -> list[RoundOutcome]:
    """Every node trains round ``round_``; every node aggregates every update."""
    return exchange_updates(nodes, [node.train(round_) for node in nodes], round_)
