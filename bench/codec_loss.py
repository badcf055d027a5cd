"""Held-out loss after N rounds, one run per update codec, everything else equal.

Four honest NodeTrainers with fixed identities (so fixed shards) train the demo's default model
for ``--rounds`` rounds in one process; updates travel as blocks copied between their stores
(what the block exchange does), each round aggregated by every node with CenteredClip. Only the
run's ``update_codec`` differs between runs, so the loss difference is the codec's (with error
feedback for the lossy ones). ``cnode demo --codec`` shows the same on real processes, but its
identities, hence shards, are fresh each time. ``--partitioned``: each round is partitioned
instead (4 partitions, node p aggregates partition p, every node applies the 4 outputs), so the
result codec (``sparse-int8:2K`` in a sparse run) is in the loop too; the wire bytes then also
count the 3 other partitions' outputs.

    .venv/bin/python bench/codec_loss.py                       # f32, bf16, int8-blockwise
    .venv/bin/python bench/codec_loss.py --rounds 8 --codec f32 int8-blockwise
    .venv/bin/python bench/codec_loss.py --codec f32 sparse-topk --density 0.015625 0.03125
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import structlog
import torch

from cnode.aggregation import CODECS
from cnode.auth import Identity
from cnode.node.train import NodeTrainer, TrainingConfig, open_update_header
from cnode.storage import BlockStore, manifest_closure

PEERS = 4


def _copy(src: BlockStore, dst: BlockStore, root: object) -> int:
    """Copy the blocks of the manifest ``root`` that ``dst`` lacks; the bytes copied."""
    copied = 0
    for cid in manifest_closure(src, root):  # type: ignore[arg-type]
        if not dst.has(cid):
            dst.put(cid, src.get(cid))
            copied += src.size(cid)
    return copied


def _partitioned_round(nodes: list[NodeTrainer], round_: int, headers: dict) -> int:
    """Node p aggregates partition p; every node fetches the others' outputs and applies all.
    Returns the bytes of outputs node 0 fetched."""
    parts = len(nodes)
    results = {}
    for p, node in enumerate(nodes):
        envelope, result = node.aggregate_partition(
            round_, headers, partition=p, parts=parts, missing={}
        )
        cid = node.store.put_new(envelope, 0x71)
        results[p] = (cid, result)
    wire = 0
    for node in nodes:
        for p, (cid, result) in results.items():
            node.store.put(cid, nodes[p].store.get(cid))
            if result.output is not None:
                got = _copy(nodes[p].store, node.store, result.output)
                wire += got if node is nodes[0] else 0
    outputs = {p: r.output for p, (_, r) in results.items()}
    for node in nodes:
        node.apply_partitions(round_, results, outputs, parts=parts, dropped={})
    return wire


def _outer_keys(spec: str) -> dict[str, object]:
    """``sgd:LR`` or ``nesterov:LR:MOMENTUM`` as [training] keys (specs/training.md)."""
    name, *values = spec.split(":")
    if name == "sgd" and len(values) == 1:
        return {"outer_optimizer": "sgd", "outer_lr": float(values[0])}
    if name == "nesterov" and len(values) == 2:
        return {
            "outer_optimizer": "nesterov",
            "outer_lr": float(values[0]),
            "outer_momentum": float(values[1]),
        }
    raise SystemExit(f"--outer {spec!r}: expected sgd:LR or nesterov:LR:MOMENTUM")


def _run(
    codec: str,
    rounds: int,
    work: Path,
    density: float = 1 / 64,
    partitioned: bool = False,
    outer: str = "sgd:1",
    decay: float = 1.0,
    extra: dict[str, object] | None = None,
) -> tuple[list[float], int, str]:
    keys = {"update_codec": codec, "update_density": density, **_outer_keys(outer), **(extra or {})}
    if codec != "f32":
        keys["error_decay"] = decay
    config = TrainingConfig.from_dict(keys)
    nodes = [
        NodeTrainer(
            config,
            run="bench",
            identity=Identity.from_seed(bytes([i + 1]) * 32),
            store=BlockStore(work / f"{codec}-{density}-{outer}-{decay}" / f"n{i}"),
        )
        for i in range(PEERS)
    ]
    losses, wire = [], 0
    for round_ in range(1, rounds + 1):
        own = [node.train(round_) for node in nodes]
        for node in nodes:
            headers = {}
            for o, src in zip(own, nodes, strict=True):
                for cid in manifest_closure(src.store, o.header.update):
                    if not node.store.has(cid):
                        node.store.put(cid, src.store.get(cid))
                        wire += src.store.size(cid) if node is nodes[0] else 0
                node.store.put(o.header_cid, o.envelope)
                header = open_update_header(o.envelope, run="bench", round_=round_)
                headers[src.peer] = (o.header_cid, header)
            if not partitioned:
                node.aggregate(round_, headers, {})
        if partitioned:
            wire += _partitioned_round(nodes, round_, headers)
        assert len({n.state_cid for n in nodes}) == 1
        losses.append(nodes[0].evaluate())
    return losses, wire, str(nodes[0].state_cid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--codec", nargs="+", choices=CODECS, default=list(CODECS))
    parser.add_argument(
        "--density",
        nargs="+",
        type=float,
        default=[1 / 64],
        help="sparse-topk: training.update_density values to run (one run each)",
    )
    parser.add_argument("--partitioned", action="store_true", help="partitioned rounds")
    parser.add_argument(
        "--outer",
        nargs="+",
        default=["sgd:1"],
        help="outer optimizers to run each codec with: sgd:LR or nesterov:LR:MOMENTUM; the first "
        "one's f32 run is the baseline",
    )
    parser.add_argument(
        "--error-decay",
        nargs="+",
        type=float,
        default=[1.0],
        help="lossy codecs: training.error_decay values to run (one run each)",
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=JSON",
        help="[training] keys every run gets, e.g. local_steps=8 aggregator='\"mean\"'",
    )
    args = parser.parse_args()
    extra = {k: json.loads(v) for k, _, v in (item.partition("=") for item in args.set)}
    runs = [
        (
            (f"{c}@{d:g}" if c == "sparse-topk" else c)
            + ("" if e == 1.0 else f" decay {e:g}")
            + ("" if o == "sgd:1" else f" {o}"),
            c,
            d,
            o,
            e,
        )
        for o in args.outer
        for c in args.codec
        for d in (args.density if c == "sparse-topk" else [1 / 64])
        for e in (args.error_decay if c != "f32" else [1.0])
    ]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory(prefix="cnode-codec-loss-") as tmp:
        for codec, name, density, outer, decay in runs:
            began = time.perf_counter()
            losses, wire, state = _run(
                name, args.rounds, Path(tmp), density, args.partitioned, outer, decay, extra
            )
            results[codec] = (losses, wire)
            print(
                f"{codec:>24}: loss per round {' '.join(f'{v:.4f}' for v in losses)}; "
                f"fetched by one node {wire / 1e6:.2f} MB; {time.perf_counter() - began:.0f} s; "
                f"final state {state[:16]}…"
            )
    baseline = next((c for c, name, _, _, _ in runs if name == "f32"), None)
    if baseline is not None:
        ref_loss, ref_wire = results[baseline][0][-1], results[baseline][1]
        for codec, (losses, wire) in results.items():
            print(
                f"{codec:>24} vs {baseline} after {args.rounds} rounds: loss {losses[-1]:.4f} vs "
                f"{ref_loss:.4f} ({(losses[-1] / ref_loss - 1) * 100:+.2f}%), bytes "
                f"{wire / ref_wire:.4f}x"
            )


if __name__ == "__main__":
    main()
