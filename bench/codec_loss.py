"""Held-out loss per round, one run per update codec, everything else equal; and the bytes.

Four honest NodeTrainers with fixed identities (so fixed shards) train the demo's default model
(~171k parameters: 64 rounds x 3 codecs fit in ~15 minutes on 2 shared cores, where the 10.2M
model's would take hours; the 10.2M model's update bytes are measured apart, see ``--bytes``)
for ``--rounds`` rounds in one process; updates travel as blocks copied between their stores
(what the block exchange does), each round aggregated by every node with the node's own
``NodeTrainer.aggregate`` (codec, error feedback, CenteredClip, outer step: the package's code).
Only the codec keys differ between runs, so the loss difference is the codec's. ``cnode demo
--codec`` shows the same on real processes, but its identities, hence shards, are fresh each
time. ``--partitioned``: each round is partitioned instead (4 partitions, node p aggregates
partition p, every node applies the 4 outputs), so the result codec (``sparse-int8:2K`` in a
sparse run) is in the loop too; the wire bytes then also count the 3 other partitions' outputs.

Printed per run: the loss per round, the bytes one node fetched (cumulative), the bytes it had
fetched when the run first reached f32's loss of round ``--target-round`` (default 32), and at
each ``--flush-at`` round (default 8) the loss with a final flush of the error buffer: every
node sends what its residual would add to its next update (``error_decay x residual``) once,
dense, aggregated and applied by the node's own ``aggregate_round`` (evaluation only; the run
goes on unflushed). ``--bytes``: one update of the 10.2M model (bench/round.py's) and of the
demo model, stored by the node's ``encode_update``/``store_update``, against f32's.

    .venv/bin/python bench/codec_loss.py --rounds 64                  # f32, int8, sparse-topk
    .venv/bin/python bench/codec_loss.py --rounds 8 --codec f32 int8-blockwise
    .venv/bin/python bench/codec_loss.py --codec sparse-topk --error-decay 0.95 --outer sgd:2
    .venv/bin/python bench/codec_loss.py --bytes --codec f32 int8-blockwise sparse-topk
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
from cnode.node.train import (
    NodeTrainer,
    TrainingConfig,
    aggregate_round,
    encode_update,
    evaluate,
    open_update_header,
    state_cid,
    store_update,
)
from cnode.node.train.checkpoint import genesis_state
from cnode.node.train.model import with_residual
from cnode.storage import BlockStore, manifest_closure

PEERS = 4
# bench/round.py's 10.2M model (10,180,352 parameters), for --bytes.
MODEL_10M = {"n_layer": 6, "n_embd": 368, "n_head": 4, "n_positions": 64}


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


def _config(codec: str, density: float, outer: str, decay: float, extra: dict) -> TrainingConfig:
    keys = {"update_codec": codec, "update_density": density, **_outer_keys(outer), **extra}
    if codec != "f32":
        keys["error_decay"] = decay
    return TrainingConfig.from_dict(keys)


def _flushed_loss(nodes: list[NodeTrainer]) -> float:
    """Held-out loss if every node now sent its error buffer once, dense (f32), aggregated and
    applied with the run's rule and outer step; the nodes are left as they were."""
    node = nodes[0]
    flushes = {}
    for n in nodes:
        if n.residual is None:
            return node.evaluate()
        zero = {k: torch.zeros_like(t) for k, t in n.residual.tensors.items()}
        flushes[n.peer] = with_residual(zero, n.residual, n.config.error_decay)
    result = aggregate_round(node.state, flushes, node.config, node.momentum)
    return evaluate(node.model, result.state, node.data)


def _run(
    config: TrainingConfig,
    rounds: int,
    work: Path,
    partitioned: bool = False,
    flush_at: tuple[int, ...] = (),
) -> tuple[list[float], list[int], dict[int, float], str]:
    """Loss per round, bytes node 0 fetched up to each round, flushed losses, final state."""
    nodes = [
        NodeTrainer(
            config,
            run="bench",
            identity=Identity.from_seed(bytes([i + 1]) * 32),
            store=BlockStore(work / f"n{i}"),
        )
        for i in range(PEERS)
    ]
    losses: list[float] = []
    wires: list[int] = []
    flushed: dict[int, float] = {}
    wire = 0
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
        wires.append(wire)
        if round_ in flush_at:
            flushed[round_] = _flushed_loss(nodes)
    return losses, wires, flushed, str(nodes[0].state_cid)


def _update_bytes(codec: str, density: float, model: dict | None) -> tuple[int, int]:
    """(bytes of one stored update with ``codec``, with f32) for ``model`` (None: the demo's):
    a Gaussian delta through the node's encode_update and store_update, manifest included."""
    keys = {"model": model} if model else {}
    sizes = []
    for name in (codec, "f32"):
        config = TrainingConfig.from_dict({**keys, "update_codec": name, "update_density": density})
        state = genesis_state(config)
        gen = torch.Generator().manual_seed(0)
        delta = {k: torch.randn(t.shape, generator=gen) for k, t in state.items()}
        encoded, _ = encode_update(delta, config.wire_codec)
        with tempfile.TemporaryDirectory(prefix="cnode-codec-bytes-") as tmp:
            store = BlockStore(Path(tmp))
            root = store_update(
                store, encoded, run="bench", round_=1, base=state_cid(state),
                codec=config.wire_codec,
            )  # fmt: skip
            sizes.append(sum(store.size(c) for c in manifest_closure(store, root)))
    return sizes[0], sizes[1]


def _pct(x: float, ref: float) -> str:
    return f"{(x / ref - 1) * 100:+.2f}%"


def _report(results: dict, baseline: str | None, args: argparse.Namespace) -> dict:
    """Print each run against the baseline; the JSON summary."""
    out: dict = {"rounds": args.rounds, "baseline": baseline, "runs": {}}
    ref = results[baseline] if baseline else None
    target = None
    if ref is not None and len(ref[0]) >= args.target_round:
        target = ref[0][args.target_round - 1]
    for name, (losses, wires, flushed, state) in results.items():
        reach = next((i for i, v in enumerate(losses) if target is not None and v <= target), None)
        row = {
            "loss": [round(v, 4) for v in losses],
            "bytes": wires[-1],
            "flushed": {r: round(v, 4) for r, v in flushed.items()},
            "bytes_to_target": None if reach is None else wires[reach],
            "round_to_target": None if reach is None else reach + 1,
            "state": state,
        }
        out["runs"][name] = row
        if ref is None:
            continue
        line = f"{name:>28} vs {baseline}:"
        for r in sorted({8, 32, 64, args.rounds}):
            if r <= args.rounds:
                line += f" round {r} {losses[r - 1]:.4f} ({_pct(losses[r - 1], ref[0][r - 1])})"
        for r, v in sorted(flushed.items()):
            line += f"; flushed at {r}: {v:.4f} ({_pct(v, ref[0][r - 1])})"
        best = min(range(len(losses)), key=losses.__getitem__)
        line += f"; best {losses[best]:.4f} at round {best + 1} ({_pct(losses[best], min(ref[0]))}"
        line += f" vs f32's best); bytes {wires[-1] / 1e6:.2f} MB ({wires[-1] / ref[1][-1]:.4f}x)"
        if target is not None:
            line += f"; to f32's round-{args.target_round} loss {target:.4f}: " + (
                "not reached"
                if reach is None
                else f"round {reach + 1}, {wires[reach] / 1e6:.2f} MB "
                f"({wires[reach] / ref[1][args.target_round - 1]:.4f}x f32's)"
            )
        print(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=64)
    parser.add_argument(
        "--codec", nargs="+", choices=CODECS, default=["f32", "int8-blockwise", "sparse-topk"]
    )
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
        help="outer optimizers to run sparse-topk with: sgd:LR or nesterov:LR:MOMENTUM (the "
        "other codecs run with the first)",
    )
    parser.add_argument(
        "--error-decay",
        nargs="+",
        type=float,
        default=[1.0],
        help="sparse-topk: training.error_decay values to run (one run each; the other "
        "lossy codecs run with 1)",
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=JSON",
        help="[training] keys every run gets, e.g. local_steps=8 aggregator='\"mean\"'",
    )
    parser.add_argument("--target-round", type=int, default=32, help="f32's loss to reach")
    parser.add_argument("--flush-at", type=int, nargs="*", default=[8], help="flushed losses")
    parser.add_argument("--bytes", action="store_true", help="update bytes only (10.2M, demo)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    extra = {k: json.loads(v) for k, _, v in (item.partition("=") for item in args.set)}
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)
    if args.bytes:
        for codec in args.codec:
            for d in args.density if codec == "sparse-topk" else [1 / 64]:
                for label, model in (("10.2M model", MODEL_10M), ("demo model", None)):
                    got, f32 = _update_bytes(codec, d, model)
                    name = f"{codec}@{d:g}" if codec == "sparse-topk" else codec
                    print(f"{name} {label}: {got:,} bytes vs f32 {f32:,} ({got / f32:.4f}x)")
        return
    runs = [
        (
            (f"{c}@{d:g}" if c == "sparse-topk" else c)
            + ("" if c != "sparse-topk" else f" decay {e:g} {o}"),
            _config(c, d, o, e, extra),
        )
        for c in args.codec
        for o in (args.outer if c == "sparse-topk" else args.outer[:1])
        for d in (args.density if c == "sparse-topk" else [1 / 64])
        for e in (args.error_decay if c == "sparse-topk" else [1.0])
    ]
    results = {}
    with tempfile.TemporaryDirectory(prefix="cnode-codec-loss-") as tmp:
        for i, (name, config) in enumerate(runs):
            began = time.perf_counter()
            got = _run(config, args.rounds, Path(tmp) / f"run{i}", args.partitioned,
                       tuple(args.flush_at))  # fmt: skip
            results[name] = got
            print(
                f"{name:>28}: loss per round {' '.join(f'{v:.4f}' for v in got[0])}; "
                f"fetched by one node {got[1][-1] / 1e6:.2f} MB; "
                f"{time.perf_counter() - began:.0f} s; final state {got[3][:16]}…",
                flush=True,
            )
    baseline = "f32" if "f32" in results else None
    out = _report(results, baseline, args)
    if args.json:
        args.json.write_text(json.dumps({**out, "set": extra}, indent=1) + "\n")


if __name__ == "__main__":
    main()
