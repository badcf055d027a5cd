"""Memory and start-up time of training on a dataset of many Parquet files (issue 39).

Generates two datasets of Parquet files of the same size (--file-mb) under /tmp, a small one
(--small-mb) and a large one (--large-mb), serves them from a local HF-compatible endpoint (the
tests' FakeHub) as two dataset repos, and runs, in a fresh process per dataset with its own empty
huggingface_hub cache, what a node does with its data: ``TextData.build`` (file list, tokenizer,
held-out set), then --rounds rounds of ``train_local`` on its shard's file for the round (a Llama
built from its config), prefetching the next round's file as ``NodeTrainer.train`` does, and
reading the scoring batches of two other peers each round as a scorer does. It prints

* each process's peak RSS and the growth from the small dataset to the large one (goal: at most
  64 MB: memory does not grow with the dataset);
* the time from the start to the first local step on the large dataset, against the baseline
  measured in the same run: the time to download and tokenize the files of one shard (goal:
  ratio at most 1).

The generated data is deleted at the end.

    flock /tmp/cnode-heavy.lock nice -n 5 .venv/bin/python bench/data_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LLAMA = {
    "architecture": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "vocab_size": 1024,
}  # fmt: skip


def _training(corpus: str) -> dict[str, Any]:
    return {
        "model": LLAMA,
        "data": {"corpus": corpus, "seq_len": 64, "eval_sequences": 16, "n_shards": 4},
        "local_steps": 4,
        "batch_size": 8,
    }


def _generate(folder: Path, total_mb: int, file_mb: int, seed: int) -> list[Path]:
    """Parquet files of ~file_mb MB each, ~total_mb MB in all: rows of pseudo-words."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    vocab = [
        "".join(map(chr, rng.choice(letters, size=int(n)))) for n in rng.integers(2, 10, 20000)
    ]
    folder.mkdir(parents=True)
    paths = []
    for i in range(max(1, total_mb // file_mb)):
        path = folder / f"data/train-{i:05d}.parquet"
        path.parent.mkdir(exist_ok=True)
        written = 0
        # Uncompressed, so the file's size on disk is its text's: file_mb MB of it.
        with pq.ParquetWriter(
            str(path), pa.schema([("text", pa.string())]), compression="none"
        ) as w:
            while written < file_mb * 2**20:
                words = rng.integers(0, len(vocab), size=(1000, 200))
                texts = [" ".join(vocab[j] for j in row) for row in words]
                w.write_table(pa.table({"text": texts}))
                written += sum(len(t) for t in texts)
        paths.append(path)
    return paths


def _serve(hub: Any, repo: str, folder: Path) -> str:
    """Put the files of ``folder`` into ``hub`` as dataset ``repo``; its commit sha."""
    from tests.support.hf_hub import Repo

    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*.parquet")}
    sha = hub.new_sha()
    with hub.lock:
        hub.datasets[repo] = Repo(repo, "datasets", [(sha, files)], {"main": sha})
    return str(sha)


def _child(mode: str, corpus: str, rounds: int) -> dict[str, Any]:
    import torch

    from cnode.node.train import TextData, TrainingConfig, build_model, model_state, train_local

    torch.set_num_threads(1)
    began = time.perf_counter()  # after the imports: from here on, what the data costs
    config = TrainingConfig.for_run(_training(corpus))
    out: dict[str, Any] = {}
    if mode == "shard":  # the baseline: download and tokenize every file of shard 0
        data = TextData.build(config.data, config.model)  # file list, tokenizer, held-out
        streamed = data.train
        assert not isinstance(streamed, torch.Tensor)
        t0 = time.perf_counter()
        units = streamed.units(0, config.seed)
        for index in sorted({u[0] for u in units}):
            streamed.ensure(index)
        out["shard_files"] = len({u[0] for u in units})
        out["shard_s"] = time.perf_counter() - t0
    else:
        data = TextData.build(config.data, config.model)
        model = build_model(config)
        state = model_state(model)
        for round_ in range(1, rounds + 1):
            data.prefetch("peer-a", round_ + 1, seed=config.seed)
            local = train_local(model, state, data, config, peer_id="peer-a", round_=round_)
            if round_ == 1:
                out["first_step_s"] = time.perf_counter() - began
            state = {k: state[k] + local.delta[k] for k in state}
            for peer in ("peer-b", "peer-c"):  # a scorer reads the batches of others' rounds
                ids = data.shard(peer, round_, seed=config.seed)
                data.train[ids[: min(16, len(ids))]]
        out["files"] = len(data.train.files.files)  # type: ignore[union-attr]
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _run_child(mode: str, corpus: str, hf_home: Path, endpoint: str, rounds: int) -> Any:
    env = dict(os.environ, HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, OMP_NUM_THREADS="1")
    env.pop("HF_TOKEN", None)
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--corpus", corpus, "--rounds", str(rounds)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"child {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small-mb", type=int, default=50)
    ap.add_argument("--large-mb", type=int, default=500)
    ap.add_argument("--file-mb", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=("train", "shard"))
    ap.add_argument("--corpus")
    args = ap.parse_args()
    if args.child:
        import logging

        import structlog

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        print(json.dumps(_child(args.child, args.corpus, args.rounds)))
        return
    sys.path.insert(0, str(ROOT))
    from tests.support.hf_hub import FakeHub

    tmp = Path(tempfile.mkdtemp(prefix="cnode-data-memory-", dir="/tmp"))
    try:
        with FakeHub() as hub:
            corpora = {}
            for name, mb, seed in (("small", args.small_mb, 1), ("large", args.large_mb, 2)):
                t0 = time.perf_counter()
                files = _generate(tmp / name, mb, args.file_mb, seed)
                size = sum(p.stat().st_size for p in files) / 2**20
                print(f"generated {name}: {len(files)} files, {size:.0f} MB "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
                corpora[name] = (
                    f"hf://datasets/bench/{name}@{_serve(hub, f'bench/{name}', tmp / name)}"
                )
            results = {}
            for name, corpus in corpora.items():
                results[name] = _run_child(
                    "train", corpus, tmp / f"hf-{name}", hub.url, args.rounds
                )
                print(f"{name}: {json.dumps(results[name])}", flush=True)
            shard = _run_child("shard", corpora["large"], tmp / "hf-shard", hub.url, args.rounds)
            print(f"one shard of large: {json.dumps(shard)}", flush=True)
        growth = results["large"]["peak_rss_mb"] - results["small"]["peak_rss_mb"]
        ratio = results["large"]["first_step_s"] / shard["shard_s"]
        small, large = results["small"]["peak_rss_mb"], results["large"]["peak_rss_mb"]
        print(f"peak RSS: small {small:.0f} MB, large {large:.0f} MB, growth {growth:+.0f} MB "
              "(goal <= 64)")  # fmt: skip
        print(f"first local step on large: {results['large']['first_step_s']:.1f} s; baseline "
              f"(download + tokenize the {shard['shard_files']} files of one shard): "
              f"{shard['shard_s']:.1f} s; ratio {ratio:.2f} (goal <= 1)")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
