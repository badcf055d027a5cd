"""Datasets of many Parquet and JSONL files (issue 39), against the local FakeHub: a repo of 3
Parquet shards and 1 JSONL shard generated here, read at one commit; the shard map a pure function
of the commit, the file list and the seed; only the files a round needs downloaded; the same
sequences byte for byte in two processes from separately downloaded copies; and one clear error,
naming the file and the row, for every bad input, with nothing stored lost."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
import torch
from huggingface_hub import HfApi

from cnode.node.train import TextData, TrainingConfig, TrainingConfigError
from cnode.node.train.model import corrupt_data
from cnode.node.train.model._data import _build_cached, train_tokenizer
from cnode.node.train.model._files import DatasetError, DatasetFiles
from cnode.node.train.model._stream import token_cache_dir
from tests.support.datasets import four_shards, jsonl_bytes, parquet_bytes, rows, upload_dataset
from tests.support.fixtures import hf_hub  # noqa: F401 (fixture)
from tests.support.hf_hub import FakeHub

ROOT = Path(__file__).resolve().parents[3]
REPO = "acme/four-shards"
PEERS = ("peer-a", "peer-b", "peer-c")


@pytest.fixture(autouse=True)
def _hub_client_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's cache (and so the token cache) under tmp_path; no token sent."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)


def _config(corpus: str, **data: Any) -> TrainingConfig:
    return TrainingConfig.for_run(
        {
            "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32,
                      "vocab_size": 300},
            "data": {"corpus": corpus, "seq_len": 32, "eval_sequences": 8, "n_shards": 4,
                     **data},
        }
    )  # fmt: skip


def _build(config: TrainingConfig) -> TextData:
    """A fresh build (TextData.build keeps the last few per config, in memory)."""
    _build_cached.cache_clear()
    return TextData.build(config.data, config.model)


def _downloads(hub: FakeHub) -> list[str]:
    return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in hub.requests
            if m == "GET" and "/resolve/" in p]  # fmt: skip


@pytest.fixture
def dataset(hf_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    sha = upload_dataset(hf_hub, REPO, four_shards())
    hf_hub.requests.clear()
    return f"hf://datasets/{REPO}@{sha}"


def test_every_file_of_the_commit_is_read_and_shards_are_a_function_of_list_and_seed(
    dataset: str,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    data = _build(_config(dataset))
    files = data.train.files  # type: ignore[union-attr]
    assert [f.path for f in files.files] == [
        "data/train-00000-of-00004.parquet", "data/train-00001-of-00004.parquet",
        "data/train-00002-of-00004.parquet", "data/train-00003-of-00004.jsonl",
    ]  # fmt: skip
    assert data.eval.shape == (8, 32)
    # Every file is in exactly one shard (4 files, 4 shards: one piece each).
    units = [data.train.units(s, 0) for s in range(4)]  # type: ignore[union-attr]
    assert sorted(u for us in units for u in us) == [(i, 0) for i in range(4)]
    # Another seed deals them otherwise (with 4 units, some seed of the first few does).
    others = [[data.train.units(s, seed) for s in range(4)] for seed in range(1, 6)]  # type: ignore[union-attr]
    assert any(o != units for o in others)
    # Packed: rows follow each other with <|endoftext|> (id 0) between them.
    seqs = data.train[data.shard_of_index(0, seed=0)]
    assert seqs.shape[1] == 32 and int((seqs == 0).sum()) > 0 and int(seqs.max()) < 300
    # A fresh build (new cache, same commit and seed) cuts the same sequences.
    again = _build(_config(dataset))
    for peer in PEERS:
        for round_ in range(1, 4):
            assert torch.equal(data.shard(peer, round_, seed=0), again.shard(peer, round_, seed=0))
    # The held-out sequences (the first file's first 8) are not trained on.
    first = data.train.unit_ids((0, 0))  # type: ignore[union-attr]
    assert int((first & 0xFFFFFFFF).min()) == 8


def test_a_peer_downloads_only_what_its_rounds_need(
    dataset: str,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    data = _build(_config(dataset))
    # Before any round: the first file only (the tokenizer's text and the held-out set).
    assert _downloads(hf_hub) == ["data/train-00000-of-00004.parquet"]
    unit = data.train.round_unit(data.shard_index("peer-a", 1, seed=0), "peer-a", 1, 0)  # type: ignore[union-attr]
    data.batches("peer-a", 1, seed=0, steps=2, batch_size=2)
    want = {"data/train-00000-of-00004.parquet", data.train.files.files[unit[0]].path}  # type: ignore[union-attr]
    assert set(_downloads(hf_hub)) == want
    # The next round's file comes ahead of time, in the background.
    data.prefetch("peer-a", 2, seed=0)
    nxt = data.train.round_unit(data.shard_index("peer-a", 2, seed=0), "peer-a", 2, 0)  # type: ignore[union-attr]
    path = data.train.files.files[nxt[0]].path  # type: ignore[union-attr]
    for _ in range(200):
        if path in _downloads(hf_hub) and nxt[0] in data.train._lengths:  # type: ignore[union-attr]
            break
        import time

        time.sleep(0.05)
    assert path in _downloads(hf_hub)
    assert len(set(_downloads(hf_hub))) <= 3


_PRINT_SEQUENCES = textwrap.dedent(
    """
    import hashlib, json, sys
    from cnode.node.train import TextData, TrainingConfig
    config = TrainingConfig.for_run(json.loads(sys.argv[1]))
    data = TextData.build(config.data, config.model)
    out = {"eval": hashlib.sha256(data.eval.numpy().tobytes()).hexdigest(),
           "tokenizer": hashlib.sha256(data.tokenizer_json.encode()).hexdigest()}
    for peer in ("peer-a", "peer-b", "peer-c"):
        for r in (1, 2, 3):
            ids = data.shard(peer, r, seed=config.seed)
            batches = data.batches(peer, r, seed=config.seed, steps=2, batch_size=4)
            h = hashlib.sha256(ids.numpy().tobytes())
            h.update(data.train[ids].numpy().tobytes())
            for b in batches:
                h.update(b.numpy().tobytes())
            out[f"{peer}/{r}"] = h.hexdigest()
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_two_processes_cut_the_same_sequences_from_separate_downloads(
    dataset: str,
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    raw = {
        "model": {"architecture": "llama", "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                  "max_position_embeddings": 64, "vocab_size": 300},
        "data": {"corpus": dataset, "seq_len": 32, "eval_sequences": 8, "n_shards": 4},
    }  # fmt: skip
    # The tokenizer of a Hub repo (training.model.tokenizer), not one trained here.
    tokenizer = train_tokenizer(" ".join(rows(7, 50)), 280).to_str()
    api = HfApi(endpoint=hf_hub.url, token=hf_hub.add_user("tok", orgs=["acme"]))
    api.create_repo("acme/tok")
    info = api.upload_file(
        path_or_fileobj=tokenizer.encode(), path_in_repo="tokenizer.json", repo_id="acme/tok"
    )
    raw["model"]["tokenizer"] = f"acme/tok@{info.oid}"
    outs = []
    for name in ("one", "two"):
        home = tmp_path / name
        env = dict(os.environ, HF_HOME=str(home), HF_ENDPOINT=hf_hub.url, OMP_NUM_THREADS="1")
        env.pop("HF_HUB_CACHE", None)
        done = subprocess.run(
            [sys.executable, "-c", _PRINT_SEQUENCES, json.dumps(raw)],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        # Each downloaded its own copy (and tokenized it into its own cache).
        assert list((home / "hub").rglob("*.parquet")) and list((home / "cnode-tokens").iterdir())
    assert outs[0] == outs[1]
    assert len(set(outs[0].values())) == len(outs[0])  # different rounds, different sequences
    assert outs[0]["tokenizer"] == hashlib.sha256(tokenizer.encode()).hexdigest()


def test_a_local_folder_with_a_split_a_pattern_and_a_held_out_file(tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    (folder / "train").mkdir(parents=True)
    (folder / "validation").mkdir()
    for i in range(2):
        (folder / "train" / f"{i}.parquet").write_bytes(parquet_bytes(rows(i, 200)))
    (folder / "train" / "notes.txt").write_text("not data")
    (folder / "validation" / "0.jsonl").write_bytes(jsonl_bytes(rows(9, 100)))
    config = _config(str(folder), split="train", held_out="validation/0.jsonl")
    data = _build(config)
    files = data.train.files  # type: ignore[union-attr]
    assert [f.path for f in files.files] == ["train/0.parquet", "train/1.parquet"]
    assert files.held_out is not None and files.held_out.path == "validation/0.jsonl"
    # A named held-out file: no training file gives up its first sequences.
    assert data.train.skip_first == 0  # type: ignore[union-attr]
    batch = data.batches("p", 1, seed=0, steps=1, batch_size=4)[0]
    assert batch.shape == (4, 32)
    only = _build(_config(str(folder), files="train/1.*"))
    assert [f.path for f in only.train.files.files] == ["train/1.parquet"]  # type: ignore[union-attr]
    # One Parquet file alone is a dataset of one file.
    one = _build(_config(str(folder / "train" / "0.parquet")))
    assert len(one.train.files.files) == 1  # type: ignore[union-attr]


def test_data_attacks_corrupt_what_a_streamed_dataset_reads(tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "0.parquet").write_bytes(parquet_bytes(rows(0, 300)))
    data = _build(_config(str(folder), n_shards=2))
    ids = data.shard("p", 1, seed=0)[:4]
    flipped = corrupt_data(data, "flipped_tokens", 300)
    assert torch.equal(flipped.train[ids], 299 - data.train[ids])
    shuffled = corrupt_data(data, "shuffled_tokens", 300).train[ids]
    assert not torch.equal(shuffled, data.train[ids])
    assert torch.equal(shuffled.sort(dim=1).values, data.train[ids].sort(dim=1).values)
    assert torch.equal(flipped.shard("p", 1, seed=0), data.shard("p", 1, seed=0))


# -- bad input ---------------------------------------------------------------------------------


def _cache_files() -> dict[str, str]:
    root = token_cache_dir()
    if not root.exists():
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir()}


def _refused(folder: Path, contents: dict[str, bytes], message: str, **data: Any) -> str:
    """Build a dataset of ``contents`` in ``folder``: it must fail with ``message`` (a regex), in
    one line, leaving the token cache as it was (nothing half-written, nothing lost)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in contents.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(body)
    before = _cache_files()
    config = _config(str(folder), **data)
    with pytest.raises(DatasetError, match=message) as caught:
        data_ = _build(config)
        for peer in PEERS:  # every round's file, so that a bad one is met
            for round_ in range(1, 5):
                data_.batches(peer, round_, seed=0, steps=1, batch_size=2)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, TrainingConfigError)
    after = _cache_files()
    assert {k: v for k, v in after.items() if k in before} == before
    assert not [n for n in after if n.endswith(".tmp")]
    return str(caught.value)


GOOD = parquet_bytes(rows(0, 300))


def test_a_file_that_is_not_parquet_or_jsonl(tmp_path: Path) -> None:
    _refused(tmp_path / "a", {"0.parquet": GOOD, "1.csv": b"text\nhello\n"},
             r"1\.csv is not a Parquet or JSONL file", files="*")  # fmt: skip
    _refused(tmp_path / "b", {"0.parquet": GOOD, "1.parquet": b"PAR1 this is no parquet"},
             r"1\.parquet: not a valid Parquet file")  # fmt: skip
    _refused(tmp_path / "c", {"0.parquet": GOOD, "1.jsonl": b'{"text": "a"}\n[1, 2\n'},
             r"1\.jsonl row 1: not JSON Lines")  # fmt: skip


def test_a_missing_text_column(tmp_path: Path) -> None:
    _refused(tmp_path / "a", {"0.parquet": GOOD, "1.jsonl": jsonl_bytes(rows(1, 50), "body")},
             r"1\.jsonl: no column 'text' \(columns: body\)")  # fmt: skip
    _refused(tmp_path / "b", {"0.parquet": GOOD}, r"0\.parquet: no column 'content' "
             r"\(columns: text\)", text_column="content")  # fmt: skip


def test_a_row_that_is_not_utf8(tmp_path: Path) -> None:
    texts = [t.encode() for t in rows(1, 300)]
    texts[123] = b"caf\xe9 au lait"
    _refused(tmp_path / "a", {"0.parquet": GOOD, "1.parquet": parquet_bytes(texts)},
             r"1\.parquet row 123: not UTF-8 text")  # fmt: skip
    lines = jsonl_bytes(rows(2, 300)).split(b"\n")
    lines[45] = b'{"text": "na\xefve"}'
    _refused(tmp_path / "b", {"0.parquet": GOOD, "1.jsonl": b"\n".join(lines)},
             r"1\.jsonl row 45: not UTF-8 text")  # fmt: skip


def test_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file or folder"):
        _build(_config(str(tmp_path / "nowhere" / "x.parquet")))


def test_an_empty_dataset(tmp_path: Path) -> None:
    _refused(tmp_path / "a", {"notes.txt": b"x"}, "empty dataset: no Parquet or JSONL file")
    _refused(tmp_path / "b", {"0.parquet": GOOD}, "empty dataset", split="validation")
    _refused(tmp_path / "c", {"0.parquet": parquet_bytes([""] * 10)},
             r"held-out file 0\.parquet gives 0 sequences")  # fmt: skip


def test_a_parquet_file_that_lies_about_its_size(tmp_path: Path) -> None:
    body = parquet_bytes(rows(1, 300))
    cut = body[:4] + body[2004:]  # its footer (at the end) still points at the bytes cut out
    message = _refused(tmp_path / "a", {"0.parquet": GOOD, "1.parquet": cut},
                       r"1\.parquet: not a valid Parquet file")  # fmt: skip
    assert "reaches byte" in message


def test_a_hub_file_list_that_differs_from_what_was_downloaded(
    dataset: str,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    files = DatasetFiles.open(_config(dataset).data)
    good = files.local(files.files[0])  # downloaded and checked against the listing
    assert good.stat().st_size == files.files[0].size
    # The Hub now serves other bytes for a listed file: its hash is not the listed one.
    sha = dataset.rsplit("@", 1)[1]
    path = files.files[1].path
    hf_hub.tamper(REPO, path, four_shards()[path][:-10] + b"0123456789", sha, kind="datasets")
    with pytest.raises(DatasetError, match=f"{path} downloaded bytes that are not the commit"):
        files.local(files.files[1])
    # A listing whose size is not the file's.
    path = files.files[2].path
    hf_hub.listed_sizes[path] = 99
    listed = DatasetFiles.open(_config(dataset).data)
    with pytest.raises(DatasetError, match=f"{path} downloaded .* bytes, the commit lists 99"):
        listed.local(listed.files[2])
    # A listed file the Hub does not serve.
    hf_hub.failures[("GET", rf".*/resolve/.*/{files.files[3].path}")] = 404
    hf_hub.failures[("HEAD", rf".*/resolve/.*/{files.files[3].path}")] = 404
    with pytest.raises(DatasetError, match=rf"cannot load {files.files[3].path}.*HTTP 404"):
        files.local(files.files[3])
    # What was downloaded and checked before is still there, whole.
    assert good.stat().st_size == files.files[0].size


def test_unknown_dataset_or_commit_is_one_error(
    dataset: str,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    with pytest.raises(DatasetError, match="HTTP 404"):
        _build(_config(f"hf://datasets/acme/nothing@{'0' * 40}"))
    with pytest.raises(DatasetError, match="HTTP 404"):
        _build(_config(f"hf://datasets/{REPO}@{'1' * 40}"))
