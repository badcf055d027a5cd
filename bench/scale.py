"""Scale bench (issue 27): one node's checkpoint phases at 100M, 500M and 1B parameters.

Run: ``.venv/bin/python bench/scale.py [--sizes 100M,500M,1B]``. A synthetic state of float32
tensors in GPT-2 block shapes (qkv d x 3d, proj d x d, fc d x 4d, fc2 4d x d) goes through the
real storage code; each phase runs in its own child process, and its peak RSS is that
process's own high-water mark (``VmHWM`` of /proc/PID/status, which a fresh address space at
exec starts from zero; ``ru_maxrss`` would inherit the parent's peak through vfork). Every phase
prints seconds, MB/s, peak RSS and the ratio to its baseline measured in the same run:
``torch.save`` of the same state for saving, hashlib.sha256 over the same block bytes for
verifying, reading the same block files for loading (assembling the state), and a raw libp2p
stream of the same byte count between two processes (bench/_raw_stream.py) for the late
joiner, which fetches the checkpoint with ``cnode checkpoint fetch`` from 2 holder processes
(``cnode checkpoint serve``) and whose peak RSS is polled from outside (bench/fetch.py).

``--aggregate``: also a full round's aggregation of ``PEERS`` (7) synthetic int8-blockwise
updates stored in the node's block store, with the run's default rule (CenteredClip), read one
layer at a time (SegmentedUpdate + ``aggregate_round(by_layer=True)``: what a round past
WHOLE_UPDATES_MAX_BYTES does), against the whole-update path (``load_update`` of each, then
``aggregate_round``) where 7 decoded updates fit in half the available memory; the two must give
the same state CID. What it does not cover yet (see docs/benchmarks.md): the exchange with 7
holder processes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# parameters -> (d, blocks): 12 d^2 per block. 10M is a quick check that the bench runs.
SIZES = {"10M": (512, 3), "100M": (1024, 8), "500M": (2048, 10), "1B": (2048, 20)}
PEERS = 7  # the other members of a full round whose updates one node aggregates


def _state(size: str) -> dict:  # type: ignore[type-arg]
    import torch

    d, blocks = SIZES[size]
    g = torch.Generator().manual_seed(0)
    state = {}
    for b in range(blocks):
        for name, shape in (("qkv", (d, 3 * d)), ("proj", (d, d)), ("fc", (d, 4 * d)),
                            ("fc2", (4 * d, d))):  # fmt: skip
            state[f"h.{b}.{name}.weight"] = torch.empty(shape).uniform_(-0.02, 0.02, generator=g)
    return state


def _peak() -> int:
    """This process's resident high-water mark in bytes (VmHWM: its own since exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _child(args: argparse.Namespace) -> None:
    import torch

    from cnode.storage import (
        CID,
        BlockStore,
        CheckpointMeta,
        export_car,
        load_checkpoint,
        save_checkpoint,
        verify_checkpoint,
    )

    store = BlockStore(Path(args.store))
    before = _peak()  # after imports
    out: dict = {}  # type: ignore[type-arg]
    if args.child in ("save", "torch_save"):
        state = _state(args.size)
        before = _peak()  # the state itself is the caller's, not the phase's
        start = time.perf_counter()
        if args.child == "save":
            out["cid"] = str(save_checkpoint(store, state, CheckpointMeta(run_id="b", round=1)))
        else:
            torch.save(state, Path(args.store).parent / "state.pt")
    elif args.child == "verify":
        start = time.perf_counter()
        report = verify_checkpoint(store, CID.parse(args.cid))
        assert report.ok, report.faults
    elif args.child == "sha256":
        start = time.perf_counter()
        for f in sorted((Path(args.store) / "blocks").rglob("*")):
            if f.is_file():
                hashlib.sha256(f.read_bytes()).digest()
    elif args.child == "load":
        start = time.perf_counter()
        tensors, _ = load_checkpoint(store, CID.parse(args.cid))
        assert all(isinstance(t, torch.Tensor) for t in tensors.values())
    elif args.child == "read_files":
        start = time.perf_counter()
        kept = [f.read_bytes() for f in sorted((Path(args.store) / "blocks").rglob("*"))
                if f.is_file()]  # fmt: skip
        assert kept
    elif args.child in ("aggregate", "aggregate_whole"):
        before, start, out = _aggregate_child(args, store)
    else:  # car
        start = time.perf_counter()
        export_car(store, CID.parse(args.cid), Path(args.store).parent / "c.car")
    seconds = time.perf_counter() - start
    print(json.dumps({**out, "seconds": seconds, "peak": _peak(), "before": before}))


def _updates_child(args: argparse.Namespace) -> None:
    """Store PEERS synthetic int8 updates of ``args.size`` (about 1e-3 the state's scale, one
    of them 30x: an outlier for CenteredClip to clip); print their manifest CIDs."""
    import torch

    from cnode.node.train import encode_update, store_update
    from cnode.storage import BlockStore, compute_cid

    store = BlockStore(Path(args.store))
    base = compute_cid(b"scale bench parent", 0x71)
    cids = []
    for i in range(PEERS):
        g = torch.Generator().manual_seed(100 + i)
        delta = {k: torch.randn(t.shape, generator=g).mul_(1e-3 * (30 if i == PEERS - 1 else 1))
                 for k, t in _state(args.size).items()}  # fmt: skip
        encoded, _ = encode_update(delta, "int8-blockwise")
        del delta
        cids.append(str(store_update(store, encoded, run="b", round_=1, base=base,
                                     codec="int8-blockwise")))  # fmt: skip
        del encoded
    print(json.dumps({"cids": cids}))


def _aggregate_child(args: argparse.Namespace, store: object) -> tuple[int, float, dict]:  # type: ignore[type-arg]
    """Aggregate the stored updates as a full round does; (RSS before, start time, figures)."""
    from cnode.node.train import SegmentedUpdate, TrainingConfig, aggregate_round, load_update
    from cnode.storage import CID

    parent = _state(args.size)
    config = TrainingConfig.from_dict({"update_codec": "int8-blockwise"})
    before = _peak()  # the parent state is the round's own, not the phase's
    start = time.perf_counter()
    streamed = args.child == "aggregate"
    opened = SegmentedUpdate if streamed else load_update
    updates = {f"peer{i}": opened(store, CID.parse(c), peer=f"peer{i}", codec="int8-blockwise",  # type: ignore[operator]
                                  shapes=parent)
               for i, c in enumerate(args.cid.split(","))}  # fmt: skip
    result = aggregate_round(parent, updates, config, by_layer=streamed)
    return before, start, {"state_cid": str(result.state_cid),
                           "iterations": result.aggregation.params.get("iterations")}  # fmt: skip


def _run(*argv: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, __file__, *argv], capture_output=True, text=True, timeout=3600, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(size: str, phase: str, got: dict, model: int, base: dict | None, what: str) -> None:  # type: ignore[type-arg]
    extra = (got["peak"] - got["before"]) / 2**20
    ratio = ""
    if base:
        speed = model / base["seconds"] / 1e6
        ratio = f"; {what} {speed:.0f} MB/s -> {base['seconds'] / got['seconds']:.2f}x"
    print(
        f"{size:>5} {phase:<8} {got['seconds']:7.2f} s {model / got['seconds'] / 1e6:6.0f} MB/s "
        f"peak RSS {got['peak'] / 2**20:7.0f} MiB (+{extra:.0f} MiB over its start; model "
        f"{model / 2**20:.0f} MiB){ratio}",
        flush=True,
    )  # fmt: skip


def bench(size: str, tmp: Path, *, aggregate: bool = False, only_aggregate: bool = False) -> None:
    d, blocks = SIZES[size]
    params = blocks * 12 * d * d
    model = params * 4
    root = tmp / size / "blocks"
    root.mkdir(parents=True)
    common = ("--size", size, "--store", str(root))
    if only_aggregate:
        _aggregation(size, common, model)
        shutil.rmtree(tmp / size)
        return
    base_save = _run("--child", "torch_save", *common)
    (tmp / size / "state.pt").unlink()
    save = _run("--child", "save", *common)
    cid = ("--cid", save["cid"])
    _row(size, "save", save, model, base_save, "torch.save")
    _run("--child", "sha256", *common)  # warm the page cache for both
    sha = _run("--child", "sha256", *common)
    _row(size, "verify", _run("--child", "verify", *common, *cid), model, sha, "sha256")
    raw = _run("--child", "read_files", *common)
    _row(size, "load", _run("--child", "load", *common, *cid), model, raw, "read files")
    _row(size, "car", _run("--child", "car", *common, *cid), model, raw, "read files")
    _late_joiner(size, tmp / size, root, save["cid"], model)
    if aggregate:
        _aggregation(size, common, model)
    shutil.rmtree(tmp / size)


def _aggregation(size: str, common: tuple[str, ...], model: int) -> None:
    """A full round of PEERS stored updates, one layer at a time, against the whole path."""
    import psutil

    made = _run("--child", "updates", *common)
    cids = ("--cid", ",".join(made["cids"]))
    whole = None
    if PEERS * model * 2 < psutil.virtual_memory().available:  # the baseline must fit
        whole = _run("--child", "aggregate_whole", *common, *cids)
    got = _run("--child", "aggregate", *common, *cids)
    same = whole is None or whole["state_cid"] == got["state_cid"]
    extra = (got["peak"] - got["before"]) / 2**20
    base = (
        f"whole updates {whole['seconds']:.2f} s, +{(whole['peak'] - whole['before']) / 2**20:.0f}"
        f" MiB -> {whole['seconds'] / got['seconds']:.2f}x; same state CID: {same}"
        if whole else f"whole updates: not run ({PEERS} x the model does not fit)"
    )  # fmt: skip
    print(
        f"{size:>5} {'aggregate':<9} {got['seconds']:7.2f} s ({PEERS} updates, CenteredClip, "
        f"{got['iterations']} iterations) peak RSS {got['peak'] / 2**20:7.0f} MiB "
        f"(+{extra:.0f} MiB over the parent state = {extra * 2**20 / model:.2f} models); {base}",
        flush=True,
    )
    if not same:
        raise SystemExit(f"{size}: layer by layer and whole gave different states")


def _late_joiner(size: str, base: Path, store: Path, cid: str, model: int) -> None:
    """A joiner process fetches the checkpoint from 2 holder processes serving ``store``."""
    from _raw_stream import raw_stream, stop
    from fetch import _fetch, _home, _start_holders

    raw_mbps, _ = raw_stream(model)
    holders = _start_holders([_home(base, f"holder{i}", store) for i in range(2)], 0)
    try:
        seconds, mbps, peak = _fetch(_home(base, "joiner", base / "joined"), cid,
                                     [addr for _, addr in holders])  # fmt: skip
    finally:
        stop([proc for proc, _ in holders])
    print(
        f"{size:>5} {'fetch':<8} {seconds:7.2f} s {mbps:6.0f} MB/s peak RSS {peak / 2**20:7.0f} "
        f"MiB (model {model / 2**20:.0f} MiB; bound model + 512 MiB: "
        f"{'within' if peak <= model + 512 * 2**20 else 'OVER'}); raw stream {raw_mbps:.0f} "
        f"MB/s -> {mbps / raw_mbps:.2f}x",
        flush=True,
    )  # fmt: skip
    shutil.rmtree(base / "joined", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100M,500M,1B")
    parser.add_argument("--child")
    parser.add_argument("--size", default="100M")
    parser.add_argument("--store")
    parser.add_argument("--cid")
    parser.add_argument("--aggregate", action="store_true", help="also a full round's aggregation")
    parser.add_argument("--only-aggregate", action="store_true", help="only the aggregation")
    args = parser.parse_args()
    if args.child == "updates":
        _updates_child(args)
        return
    if args.child:
        _child(args)
        return
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)} (known: {', '.join(SIZES)})")
    print(f"# scale bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cnode-scale-", dir=os.environ.get("BENCH_DIR")) as t:
        for size in sizes:
            bench(size, Path(t), aggregate=args.aggregate, only_aggregate=args.only_aggregate)


if __name__ == "__main__":
    main()
