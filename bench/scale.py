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

HF export (``export_hf`` of the saved checkpoint: a ``model.safetensors`` folder) is set against
the same run's ``torch.save`` and a ``dd conv=fsync`` of the same byte count (what this disk
allows); HF import (``import_hf_verified``: the folder rebuilt into a fresh store as the exact
checkpoint, every 1 MiB slice hashed against the manifest) against sha256 over the same file.

``--aggregate``: also a full round (bench/_scale_round.py). A parent checkpoint and ``PEERS`` (7)
synthetic peers' signed int8-blockwise updates on it are stored in the node's block store, one
segment at a time; the round opens each as a SegmentedUpdate and aggregates with the run's
default rule (CenteredClip) one layer at a time (``aggregate_round(by_layer=True)``: what a round
past WHOLE_UPDATES_MAX_BYTES does), then stores the new state as the round's checkpoint; against
the whole-update path (``load_update`` of each, then ``aggregate_round``) where 7 decoded updates
fit in half the available memory; the two must give the same state CID. Then ``verify
--replay``'s replay of that checkpoint (``replay_checkpoint``: load the parent, aggregate the
signed updates again, compare every layer's chunk CIDs) against sha256 over the store's blocks
(the parent, the updates and the checkpoint: the bytes a replay reads or hashes). What it does
not cover yet (see docs/benchmarks.md): the exchange with 7 holder processes.
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

import _scale_round as rnd

# parameters -> (d, blocks): 12 d^2 per block. 10M is a quick check that the bench runs.
SIZES = {"10M": (512, 3), "100M": (1024, 8), "500M": (2048, 10), "1B": (2048, 20)}
PEERS = rnd.PEERS


def _state(size: str) -> dict:  # type: ignore[type-arg]
    import torch

    d, blocks = SIZES[size]
    g = torch.Generator().manual_seed(0)
    state = {}
    for b in range(blocks):
        for name, shape in (
            ("qkv", (d, 3 * d)),
            ("proj", (d, d)),
            ("fc", (d, 4 * d)),
            ("fc2", (4 * d, d)),
        ):
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
        export_hf,
        import_hf_verified,
        load_checkpoint,
        save_checkpoint,
        verify_checkpoint,
    )

    store = BlockStore(Path(args.store))
    before = _peak()  # after imports
    out: dict = {}  # type: ignore[type-arg]
    if args.child in ("save", "torch_save"):
        state = _state(args.size)
        d, blocks = SIZES[args.size]
        meta = CheckpointMeta(
            run_id="b", round=1, model_config={"model_type": "gpt2", "n_embd": d, "n_layer": blocks}
        )
        before = _peak()  # the state itself is the caller's, not the phase's
        start = time.perf_counter()
        if args.child == "save":
            out["cid"] = str(save_checkpoint(store, state, meta))
        else:
            torch.save(state, Path(args.store).parent / "state.pt")
    elif args.child == "verify":
        start = time.perf_counter()
        report = verify_checkpoint(store, CID.parse(args.cid))
        assert report.ok, report.faults
    elif args.child in ("sha256", "sha256_file"):
        start = time.perf_counter()
        files = (
            [Path(args.hf)]
            if args.child == "sha256_file"
            else (f for f in sorted((Path(args.store) / "blocks").rglob("*")) if f.is_file())
        )
        for f in files:
            with open(f, "rb") as handle:
                hashlib.file_digest(handle, "sha256")
    elif args.child == "load":
        start = time.perf_counter()
        tensors, _ = load_checkpoint(store, CID.parse(args.cid))
        assert all(isinstance(t, torch.Tensor) for t in tensors.values())
    elif args.child == "read_files":
        start = time.perf_counter()
        kept = [
            f.read_bytes() for f in sorted((Path(args.store) / "blocks").rglob("*")) if f.is_file()
        ]
        assert kept
    elif args.child == "hf_export":
        start = time.perf_counter()
        export_hf(store, CID.parse(args.cid), Path(args.hf))
    elif args.child == "hf_import":
        start = time.perf_counter()
        import_hf_verified(store, Path(args.hf), CID.parse(args.cid))
    elif args.child == "round_setup":
        start = time.perf_counter()
        out = rnd.setup(args.size, store, _state)
    elif args.child in ("aggregate", "aggregate_whole"):
        setup = json.loads(args.cid)
        before, start, out = rnd.aggregate(
            args.size, store, _state, _peak, setup, streamed=args.child == "aggregate"
        )
    elif args.child == "replay":
        before, start, out = rnd.replay(store, args.cid, _peak)
    else:  # car
        start = time.perf_counter()
        export_car(store, CID.parse(args.cid), Path(args.store).parent / "c.car")
    seconds = time.perf_counter() - start
    print(json.dumps({**out, "seconds": seconds, "peak": _peak(), "before": before}))


def _run(*argv: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, __file__, *argv], capture_output=True, text=True, timeout=3600, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


ROWS: list[tuple[str, ...]] = []  # the summary table: size, phase, s, peak MiB, baseline, ratio


def _row(
    size: str,
    phase: str,
    got: dict,  # type: ignore[type-arg]
    model: int,
    base: dict | None,  # type: ignore[type-arg]
    what: str,
    note: str = "",
    label: str = "model",
) -> None:
    extra = (got["peak"] - got["before"]) / 2**20
    ratio, rate = "", ""
    if base:
        speed = model / base["seconds"] / 1e6
        rate = f"{base['seconds'] / got['seconds']:.2f}x"
        ratio = f"; {what} {base['seconds']:.2f} s {speed:.0f} MB/s -> {rate}"
    print(
        f"{size:>5} {phase:<10} {got['seconds']:7.2f} s {model / got['seconds'] / 1e6:6.0f} MB/s "
        f"peak RSS {got['peak'] / 2**20:7.0f} MiB (+{extra:.0f} MiB over its start; {label} "
        f"{model / 2**20:.0f} MiB){ratio}{note}",
        flush=True,
    )
    ROWS.append(
        (
            size,
            phase,
            f"{got['seconds']:.2f}",
            f"{got['peak'] / 2**20:.0f}",
            f"{what} {base['seconds']:.2f} s" if base else "-",
            rate or "-",
        )
    )


def _dd_note(disk: dict, got: dict) -> str:  # type: ignore[type-arg]
    """A row's note: the ``dd`` baseline of the same minute and the phase's ratio to it."""
    return f"; dd conv=fsync {disk['seconds']:.2f} s -> {disk['seconds'] / got['seconds']:.2f}x"


def _dd(path: Path, nbytes: int) -> dict:  # type: ignore[type-arg]
    """``dd conv=fsync`` of ``nbytes`` zeros to ``path``: what this disk writes, this minute."""
    start = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={nbytes // 2**20}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - start
    path.unlink()
    return {"seconds": seconds}


def bench(size: str, tmp: Path, *, aggregate: bool = False, only_aggregate: bool = False) -> None:
    d, blocks = SIZES[size]
    params = blocks * 12 * d * d
    model = params * 4
    root = tmp / size / "blocks"
    root.mkdir(parents=True)
    common = ("--size", size, "--store", str(root))
    if only_aggregate:
        _aggregation(size, tmp / size, model)
        shutil.rmtree(tmp / size)
        return
    base_save = _run("--child", "torch_save", *common)
    (tmp / size / "state.pt").unlink()
    save = _run("--child", "save", *common)
    disk = _dd(tmp / size / "dd", model)
    cid = ("--cid", save["cid"])
    _run("--child", "sha256", *common)  # warm the page cache for both
    sha = _run("--child", "sha256", *common)
    _row(
        size,
        "save",
        save,
        model,
        base_save,
        "torch.save",
        f"; sha256 {sha['seconds']:.2f} s -> {sha['seconds'] / save['seconds']:.2f}x"
        + _dd_note(disk, save),
    )
    _row(size, "verify", _run("--child", "verify", *common, *cid), model, sha, "sha256")
    raw = _run("--child", "read_files", *common)
    _row(size, "load", _run("--child", "load", *common, *cid), model, raw, "read files")
    _row(size, "car", _run("--child", "car", *common, *cid), model, raw, "read files")
    (tmp / size / "c.car").unlink()
    _hf(size, tmp / size, common, cid, model, base_save)
    _late_joiner(size, tmp / size, root, save["cid"], model)
    if aggregate:
        shutil.rmtree(root)  # the disk holds the round's store next
        _aggregation(size, tmp / size, model)
    shutil.rmtree(tmp / size)


def _hf(
    size: str,
    base: Path,
    common: tuple[str, ...],
    cid: tuple[str, str],
    model: int,
    base_save: dict,
) -> None:  # type: ignore[type-arg]
    """HF export of the saved checkpoint, then its verified import into a fresh store."""
    folder = base / "hf"
    disk = _dd(base / "dd", model)
    got = _run("--child", "hf_export", *common, *cid, "--hf", str(folder))
    _row(
        size,
        "hf export",
        got,
        model,
        base_save,
        "torch.save",
        _dd_note(disk, got),
    )
    weights = ("--hf", str(folder / "model.safetensors"))
    _run("--child", "sha256_file", *common, *weights)  # warm the page cache for both
    sha = _run("--child", "sha256_file", *common, *weights)
    fresh = ("--size", size, "--store", str(base / "imported"))
    disk = _dd(base / "dd", model)
    got = _run("--child", "hf_import", *fresh, *cid, "--hf", str(folder))
    _row(
        size,
        "hf import",
        got,
        model,
        sha,
        "sha256 of the file",
        _dd_note(disk, got),
    )
    shutil.rmtree(folder)
    shutil.rmtree(base / "imported")


def _aggregation(size: str, base: Path, model: int) -> None:
    """A full round of PEERS stored updates, one layer at a time (against the whole path),
    the new state stored as a checkpoint, and that checkpoint's replay."""
    import psutil

    common = ("--size", size, "--store", str(base / "round"))
    # The round holds the parent and ~3.2 whole-model buffers (specs/training.md#memory): refuse
    # here, with the figures, rather than let the OOM killer choose on a shared machine.
    need, free = 4.5 * model + 2**30, psutil.virtual_memory().available
    if need > free:
        print(
            f"{size:>5} round: not run: it needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB "
            f"is available",
            flush=True,
        )
        return
    start = time.perf_counter()
    made = _run("--child", "round_setup", *common)
    print(
        f"{size:>5} (setup: parent checkpoint and {PEERS} signed updates stored in "
        f"{time.perf_counter() - start:.0f} s, peak RSS {made['peak'] / 2**20:.0f} MiB; "
        f"{rnd.block_bytes(base / 'round') / 1e9:.2f} GB of blocks)",
        flush=True,
    )
    setup = ("--cid", json.dumps({"parent": made["parent"], "headers": made["headers"]}))
    whole = None
    if PEERS * model * 2 < psutil.virtual_memory().available:  # the baseline must fit
        whole = _run("--child", "aggregate_whole", *common, *setup)
    got = _run("--child", "aggregate", *common, *setup)
    same = whole is None or whole["state_cid"] == got["state_cid"]
    extra = (got["peak"] - got["before"]) / 2**20
    base_line = (
        f"whole updates {whole['seconds']:.2f} s, +{(whole['peak'] - whole['before']) / 2**20:.0f}"
        f" MiB -> {whole['seconds'] / got['seconds']:.2f}x; same state CID: {same}"
        if whole
        else f"whole updates: not run ({PEERS} x the model does not fit)"
    )
    aggregated = got["seconds"] - got["store_s"]
    print(
        f"{size:>5} {'aggregate':<10} {aggregated:7.2f} s ({PEERS} updates opened in "
        f"{got['opened_s']:.1f} s, CenteredClip, {got['iterations']} iterations; then the new "
        f"state stored in {got['store_s']:.2f} s) peak RSS {got['peak'] / 2**20:7.0f} MiB "
        f"(+{extra:.0f} MiB over the parent state = {extra * 2**20 / model:.2f} models); "
        f"{base_line}",
        flush=True,
    )
    ROWS.append(
        (
            size,
            "aggregate",
            f"{aggregated:.2f}",
            f"{got['peak'] / 2**20:.0f}",
            f"whole updates {whole['seconds']:.2f} s" if whole else "-",
            f"{whole['seconds'] / aggregated:.2f}x" if whole else "-",
        )
    )
    if not same:
        raise SystemExit(f"{size}: layer by layer and whole gave different states")
    _run("--child", "sha256", *common)  # warm the page cache for both
    sha = _run("--child", "sha256", *common)
    replayed = _run("--child", "replay", *common, "--cid", got["checkpoint"])
    if replayed["state_cid"] != got["state_cid"]:
        raise SystemExit(f"{size}: the replay gave another state than the round")
    nbytes = rnd.block_bytes(base / "round")
    _row(
        size,
        "replay",
        replayed,
        nbytes,
        sha,
        "sha256 of the blocks",
        f" (MB/s over the {nbytes / 1e9:.2f} GB of blocks; the round's aggregation {aggregated:.2f}"
        f" s -> {aggregated / replayed['seconds']:.2f}x)",
        label="blocks",
    )
    shutil.rmtree(base / "round")


def _late_joiner(size: str, base: Path, store: Path, cid: str, model: int) -> None:
    """A joiner process fetches the checkpoint from 2 holder processes serving ``store``."""
    from _raw_stream import raw_stream, stop
    from fetch import _fetch, _home, _start_holders

    raw_mbps, _ = raw_stream(model)
    holders = _start_holders([_home(base, f"holder{i}", store) for i in range(2)], 0)
    try:
        seconds, mbps, peak = _fetch(
            _home(base, "joiner", base / "joined"), cid, [addr for _, addr in holders]
        )
    finally:
        stop([proc for proc, _ in holders])
    print(
        f"{size:>5} {'fetch':<8} {seconds:7.2f} s {mbps:6.0f} MB/s peak RSS {peak / 2**20:7.0f} "
        f"MiB (model {model / 2**20:.0f} MiB; bound model + 512 MiB: "
        f"{'within' if peak <= model + 512 * 2**20 else 'OVER'}); raw stream {raw_mbps:.0f} "
        f"MB/s -> {mbps / raw_mbps:.2f}x",
        flush=True,
    )
    ROWS.append(
        (
            size,
            "fetch",
            f"{seconds:.2f}",
            f"{peak / 2**20:.0f}",
            f"raw stream {model / raw_mbps / 1e6:.2f} s",
            f"{mbps / raw_mbps:.2f}x",
        )
    )
    shutil.rmtree(base / "joined", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100M,500M,1B")
    parser.add_argument("--child")
    parser.add_argument("--size", default="100M")
    parser.add_argument("--store")
    parser.add_argument("--cid")
    parser.add_argument("--hf", help="an HF folder or file (child)")
    parser.add_argument("--aggregate", action="store_true", help="also a full round's aggregation")
    parser.add_argument("--only-aggregate", action="store_true", help="only the aggregation")
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)} (known: {', '.join(SIZES)})")
    print(
        f"# scale bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
        f"{os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="cnode-scale-", dir=os.environ.get("BENCH_DIR")) as t:
        for size in sizes:
            bench(size, Path(t), aggregate=args.aggregate, only_aggregate=args.only_aggregate)
    print(
        "\n| size | phase | seconds | peak RSS MiB | baseline | ratio |\n| --- | --- | --- | --- | "
        "--- | --- |"
    )
    for row in ROWS:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
