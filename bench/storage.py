"""Storage benchmarks (issue 3): verify speed vs sha256sum, save/load time and peak RSS, dedup.

Run: ``.venv/bin/python bench/storage.py [--mb 400]``. Prints each figure and its ratio to the
baseline measured in the same run. Save and load run in child processes so their peak RSS
(``ru_maxrss`` of the child) is theirs alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYER_MB = 10  # 40 layers of 10 MB for 400 MB: each layer is 10 chunks


def _state(total_mb: int, seed: int, changed_from: int | None = None) -> dict:  # type: ignore[type-arg]
    import torch

    layers = total_mb // LAYER_MB
    state = {}
    for i in range(layers):
        layer_seed = seed if changed_from is not None and i >= changed_from else 0
        g = torch.Generator().manual_seed(layer_seed * 100_000 + i)
        state[f"model.layers.{i}.weight"] = torch.randn(
            LAYER_MB * (1 << 20) // 4, generator=g, dtype=torch.float32
        )
    return state


def _child(args: argparse.Namespace) -> None:
    """Runs in a subprocess: one save or one load, prints JSON with seconds and peak RSS."""
    import torch

    from cnode.storage import BlockStore, CheckpointMeta, load_checkpoint, save_checkpoint

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # after imports
    store = BlockStore(Path(args.store))
    if args.child == "save":
        state = _state(args.mb, seed=args.seed, changed_from=args.changed_from)
        made = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        start = time.perf_counter()
        cid = save_checkpoint(store, state, CheckpointMeta(run_id="bench", round=args.seed))
        seconds = time.perf_counter() - start
        out = {"cid": str(cid), "made_rss": made}
    else:
        start = time.perf_counter()
        tensors, _ = load_checkpoint(store, __import__("cnode.storage").storage.CID.parse(args.cid))
        seconds = time.perf_counter() - start
        assert all(isinstance(t, torch.Tensor) for t in tensors.values())
        out = {}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({**out, "seconds": seconds, "peak_rss": peak, "import_rss": baseline}))


def _run_child(*argv: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, __file__, *argv], capture_output=True, text=True, timeout=1200, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _block_files(store_root: Path) -> list[str]:
    return sorted(str(p) for p in (store_root / "blocks").rglob("*") if p.is_file())


def _sha256sum(files: list[str]) -> float:
    start = time.perf_counter()
    for i in range(0, len(files), 200):  # same files, a few sha256sum processes in a row
        subprocess.run(["sha256sum", *files[i : i + 200]], capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=400)
    parser.add_argument("--child", choices=["save", "load"])
    parser.add_argument("--store")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--changed-from", type=int)
    parser.add_argument("--cid")
    args = parser.parse_args()
    if args.child:
        _child(args)
        return

    from cnode.storage import CID, BlockStore, verify_checkpoint

    mb = args.mb
    model_bytes = mb * (1 << 20)
    with tempfile.TemporaryDirectory(prefix="cnode-bench-", dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp) / "blocks"  # = the CLI's store for --home tmp (default storage_path)
        print(f"# storage bench: {mb} MiB state_dict ({mb // LAYER_MB} float32 layers)")

        save = _run_child("--child", "save", "--store", str(root), "--mb", str(mb))
        cid = save["cid"]
        print(
            f"save: {save['seconds']:.2f} s ({model_bytes / save['seconds'] / 1e6:.0f} MB/s), "
            f"peak RSS {save['peak_rss'] / 2**20:.0f} MiB = model {mb} MiB + "
            f"{(save['peak_rss'] - model_bytes) / 2**20:.0f} MiB "
            f"(goal <= model + 256 MiB); of which torch+cnode import: "
            f"{save['import_rss'] / 2**20:.0f} MiB"
        )
        load = _run_child("--child", "load", "--store", str(root), "--cid", cid)
        print(
            f"load: {load['seconds']:.2f} s ({model_bytes / load['seconds'] / 1e6:.0f} MB/s), "
            f"peak RSS {load['peak_rss'] / 2**20:.0f} MiB = model {mb} MiB + "
            f"{(load['peak_rss'] - model_bytes) / 2**20:.0f} MiB "
            f"(goal <= model + 256 MiB); of which torch+cnode import: "
            f"{load['import_rss'] / 2**20:.0f} MiB"
        )

        store = BlockStore(root)
        files = _block_files(root)
        total = sum(os.path.getsize(f) for f in files)
        _sha256sum(files)  # warm the page cache for both contenders
        base = _sha256sum(files)
        start = time.perf_counter()
        report = verify_checkpoint(store, CID.parse(cid))
        ours = time.perf_counter() - start
        assert report.ok, report.faults
        start = time.perf_counter()
        cli = subprocess.run(
            [sys.executable, "-m", "cnode", "checkpoint", "verify", cid, "--home", tmp,
             "--json"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        cli_s = time.perf_counter() - start
        print(
            f"verify: {total / ours / 1e6:.0f} MB/s ({len(files)} blocks, {total / 1e6:.0f} MB) vs "
            f"sha256sum {total / base / 1e6:.0f} MB/s -> ratio {base / ours:.2f}x (goal >= 0.8x)"
        )
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cnode", "--version"], capture_output=True)
        startup = time.perf_counter() - start
        print(
            f"verify via `cnode checkpoint verify`: {cli_s:.2f} s wall "
            f"({total / cli_s / 1e6:.0f} MB/s, ratio {base / cli_s:.2f}x, exit {cli.returncode}); "
            f"of which CLI start-up "
            f"(`cnode --version`) {startup:.2f} s; without it {total / (cli_s - startup) / 1e6:.0f}"
            f" MB/s, ratio {base / (cli_s - startup):.2f}x"
        )

        before = {str(c) for c in store.iter_cids()}
        half = mb // LAYER_MB // 2
        second = _run_child(
            "--child", "save", "--store", str(root), "--mb", str(mb), "--seed", "1",
            "--changed-from", str(half),
        )  # fmt: skip
        new = {str(c) for c in store.iter_cids()} - before
        layers = mb // LAYER_MB
        changed_chunks = (layers - half) * LAYER_MB
        print(
            f"dedup: second checkpoint, {layers - half} of {layers} layers changed: "
            f"{len(new)} new blocks = {changed_chunks} changed chunks + 1 manifest "
            f"(expected {changed_chunks + 1}); total blocks {len(before) + len(new)} vs "
            f"{2 * len(before)} without dedup; save took {second['seconds']:.2f} s"
        )


if __name__ == "__main__":
    main()
