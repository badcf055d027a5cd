"""Datasets of many Parquet and JSONL files for tests and benches, generated (never downloaded):
random rows of words, written with pyarrow, uploaded to a FakeHub dataset repo in one commit."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import CommitOperationAdd, HfApi

from .hf_hub import FakeHub

_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial boxers "
    "and every node trains one model together on shards of text cut from many files"
)
WORDS = tuple(_TEXT.split(" "))


def rows(seed: int, n: int, words: tuple[int, int] = (20, 80)) -> list[str]:
    """``n`` rows of random words (the same for the same seed)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) for _ in range(n)]


def parquet_bytes(texts: list[str] | list[bytes], *, row_group: int = 100, **extra: list) -> bytes:  # type: ignore[type-arg]
    kind = pa.binary() if texts and isinstance(texts[0], bytes) else pa.string()
    table = pa.table({"text": pa.array(texts, type=kind), **extra})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group)
    return buf.getvalue()


def jsonl_bytes(texts: list[str], column: str = "text") -> bytes:
    return "".join(json.dumps({column: t}) + "\n" for t in texts).encode()


def four_shards(rows_per_file: int = 300) -> dict[str, bytes]:
    """The issue's dataset: 3 Parquet shards and 1 JSONL shard, plus a file that is neither."""
    files = {
        f"data/train-{i:05d}-of-00004.parquet": parquet_bytes(rows(i, rows_per_file))
        for i in range(3)
    }
    files["data/train-00003-of-00004.jsonl"] = jsonl_bytes(rows(3, rows_per_file))
    files["notes.txt"] = b"a test dataset\n"
    return files


def upload_dataset(hub: FakeHub, repo: str, files: Mapping[str, bytes]) -> str:
    """Commit ``files`` to dataset ``repo`` (created if new) on ``hub``; the commit sha."""
    owner = repo.split("/")[0]
    api = HfApi(endpoint=hub.url, token=hub.add_user(f"{owner}-writer", orgs=[owner]))
    api.create_repo(repo, repo_type="dataset", exist_ok=True)
    ops = [CommitOperationAdd(path, data) for path, data in files.items()]
    info = api.create_commit(repo, ops, commit_message="data", repo_type="dataset")
    return str(info.oid)
