"""Shipped corpus and tokenizer, sharding, batch determinism."""

from __future__ import annotations

import hashlib

import pytest
import torch

from cnode.node.train import DataConfig, ModelConfig, TrainingConfig, TrainingConfigError
from cnode.node.train.model._data import (
    TOKENIZER_FILE,
    TextData,
    load_corpus_text,
    load_tokenizer,
    shard_of,
    train_tokenizer,
)


def test_shipped_tokenizer_is_what_training_on_the_shipped_corpus_gives() -> None:
    config = TrainingConfig()
    shipped = load_tokenizer(config.data, config.model)
    retrained = train_tokenizer(load_corpus_text(config.data.corpus), config.model.vocab_size)
    assert retrained.to_str() == shipped.to_str()
    assert shipped.get_vocab_size() == config.model.vocab_size
    assert shipped.token_to_id("<|endoftext|>") == 0
    assert TOKENIZER_FILE.stat().st_size < 200_000


def test_corpus_header_is_not_trained_on() -> None:
    text = load_corpus_text(DataConfig().corpus)
    assert not text.startswith("#")
    assert 200_000 < len(text) < 400_000


def test_shards_split_the_training_sequences_and_depend_on_the_peer_id() -> None:
    config = TrainingConfig()
    data = TextData.build(config.data, config.model)
    shards = [data.shard_of_index(i) for i in range(config.data.n_shards)]
    assert sum(len(s) for s in shards) == data.train.shape[0]
    assert len(set(torch.cat(shards).tolist())) == data.train.shape[0]
    peers = [f"12D3KooWpeer{i}" for i in range(32)]
    assert len({shard_of(p, config.data.n_shards) for p in peers}) > 1
    assert torch.equal(data.shard(peers[0]), shards[shard_of(peers[0], config.data.n_shards)])


def test_batches_are_a_function_of_seed_peer_and_round() -> None:
    config = TrainingConfig()
    data = TextData.build(config.data, config.model)
    a = data.batches("peerA", 3, seed=1, steps=2, batch_size=4)
    b = data.batches("peerA", 3, seed=1, steps=2, batch_size=4)
    c = data.batches("peerA", 4, seed=1, steps=2, batch_size=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (4, config.data.seq_len)
    # the held-out sequences never appear in a batch
    held = {tuple(row.tolist()) for row in data.eval}
    assert not any(tuple(row.tolist()) in held for row in a[0])


def test_a_local_corpus_file_trains_its_own_tokenizer(tmp_path: object) -> None:
    path = tmp_path / "text.txt"  # type: ignore[operator]
    path.write_text("the quick brown fox jumps over the lazy dog. " * 2000, encoding="utf-8")
    config = TrainingConfig.from_dict(
        {"model": {"vocab_size": 300}, "data": {"corpus": str(path), "eval_sequences": 4}}
    )
    data = TextData.build(config.data, config.model)
    assert int(data.train.max()) < 300
    digest = hashlib.sha256(data.tokenizer_json.encode()).hexdigest()
    again = TextData.build(config.data, ModelConfig(vocab_size=300))
    assert hashlib.sha256(again.tokenizer_json.encode()).hexdigest() == digest


def test_missing_corpus_file_is_a_clear_error(tmp_path: object) -> None:
    config = TrainingConfig.from_dict({"data": {"corpus": str(tmp_path / "nope.txt")}})  # type: ignore[operator]
    with pytest.raises(TrainingConfigError, match="cannot read corpus"):
        TextData.build(config.data, config.model)
