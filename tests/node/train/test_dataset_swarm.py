"""Issue 39's run: 3 real ``cnode train`` nodes train a Llama-architecture model built from its
config on a Hub dataset of 3 Parquet shards and 1 JSONL shard (the local FakeHub, generated
here), agree on one state CID every round, and ``cnode checkpoint verify --replay`` rebuilds the
final checkpoint (scores and partitioned rounds on, as a run config gets them by default)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cnode.node._config import load_config
from cnode.storage import BlockStore
from tests.support.datasets import four_shards, upload_dataset
from tests.support.fixtures import hf_hub  # noqa: F401 (fixture)
from tests.support.hf_hub import FakeHub

from .swarm import Swarm

pytestmark = pytest.mark.slow

ROUNDS = 3  # three nodes on three files, a checkpoint to replay: more rounds add only time
LLAMA = {
    "architecture": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
    "vocab_size": 300,
}


def test_three_nodes_train_a_llama_on_a_hub_dataset_of_many_files_and_replay(
    tmp_path: Path,
    swarms: list[Swarm],
    hf_hub: FakeHub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The nodes' huggingface_hub cache (downloads, tokenized files) under tmp_path, no token.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    sha = upload_dataset(hf_hub, "acme/four-shards", four_shards())
    training = {
        "model": LLAMA,
        "data": {
            "corpus": f"hf://datasets/acme/four-shards@{sha}",
            "seq_len": 32,
            "eval_sequences": 8,
            "n_shards": 4,
        },
        "update_codec": "int8-blockwise",
    }
    swarm = Swarm(
        tmp_path / "swarm", ["a", "b", "c"], min_participants=3, hf_endpoint=hf_hub.url,
        training=training,
    )  # fmt: skip
    swarms.append(swarm)
    nodes = [
        swarm.start("a", rounds=ROUNDS, checkpointer=True),
        swarm.start("b", rounds=ROUNDS),
        swarm.start("c", rounds=ROUNDS),
    ]
    for node in nodes:
        assert swarm.wait_exit(node, timeout=240) == 0, swarm.describe()

    # One state CID every round, on every node.
    per_round = [{e["round"]: e["state_cid"] for e in n.events("round")} for n in nodes]
    for round_ in range(1, ROUNDS + 1):
        assert len({cids.get(round_) for cids in per_round}) == 1, (round_, per_round)
    # The data came from the dataset's files: more than one was downloaded.
    got = {p.rsplit("/", 1)[-1] for m, p, _ in hf_hub.requests if m == "GET" and "/resolve/" in p}
    assert len(got) >= 2 and all(name.endswith((".parquet", ".jsonl")) for name in got), got

    # The final checkpoint replays with the command a user runs. The rounds were partitioned,
    # so the verifier gathers every node's blocks first (as test_swarm.py does).
    verifier = tmp_path / "verifier"
    store = BlockStore(verifier / "blocks")
    for node in nodes:
        held = BlockStore(load_config(node.home).blocks_dir(node.home))
        for cid in held.iter_cids():
            if not store.has(cid):
                store.put(cid, held.get(cid))
    (verifier / "config.toml").write_text(f'storage_path = "{store.root}"\n')
    final = nodes[0].events("round")[-1]["manifest"]
    env = dict(os.environ, HF_ENDPOINT=hf_hub.url, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "cnode", "checkpoint", "verify", "--replay", final,
         "--home", str(verifier)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"replay OK: rounds {ROUNDS}..{ROUNDS}" in done.stdout or "replay OK" in done.stdout
