"""Shipped corpus and tokenizer, sharding and its per-round assignment, batch determinism."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

from cnode.node.train import DataConfig, ModelConfig, TrainingConfig, TrainingConfigError
from cnode.node.train.model._data import (
    TOKENIZER_FILE,
    TextData,
    assigned_shard,
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
    fixed = dataclasses.replace(data, assignment="fixed")
    for round_ in (1, 2, 9):  # "fixed": the shard the id hashes to, every round
        got = fixed.shard(peers[0], round_, seed=0)
        assert torch.equal(got, shards[shard_of(peers[0], config.data.n_shards)])


PEERS = [f"12D3KooWpeer{i}" for i in range(40)]


def test_the_rotating_assignment_is_a_function_of_seed_peer_and_round_only() -> None:
    forward = {(p, r): assigned_shard(p, r, n_shards=8, seed=3) for p in PEERS for r in range(40)}
    backward = {
        (p, r): assigned_shard(p, r, n_shards=8, seed=3)
        for p in reversed(PEERS)
        for r in reversed(range(40))
    }
    assert forward == backward  # no hidden state: the order of the questions does not matter
    assert all(0 <= s < 8 for s in forward.values())
    other_seed = {k: assigned_shard(*k, n_shards=8, seed=4) for k in forward}
    assert other_seed != forward  # another run's seed, another walk
    config = TrainingConfig()  # the run default rotates; TextData asks assigned_shard
    assert config.data.assignment == "rotate"
    data = TextData.build(config.data, config.model)
    for (peer, round_), shard in list(forward.items())[:50]:
        assert data.shard_index(peer, round_, seed=3) == shard
        assert torch.equal(data.shard(peer, round_, seed=3), data.shard_of_index(shard))


@pytest.mark.parametrize("n_shards", [1, 2, 6, 8, 12])
def test_every_peer_covers_every_shard_over_a_run(n_shards: int) -> None:
    for peer in PEERS:
        walk = [assigned_shard(peer, r, n_shards=n_shards, seed=0) for r in range(1, 61)]
        # every epoch of n_shards rounds visits each shard once ...
        for start in range(n_shards - 1, 60 - n_shards, n_shards):
            assert sorted(walk[start : start + n_shards]) == list(range(n_shards))
        # ... so any 2 n_shards - 1 consecutive rounds cover all the data
        for start in range(0, 60 - 2 * n_shards + 2):
            assert set(walk[start : start + 2 * n_shards - 1]) == set(range(n_shards))


def test_ids_that_hash_to_one_shard_do_not_share_it_every_round() -> None:
    a, b = next(
        (p, q)
        for i, p in enumerate(PEERS)
        for q in PEERS[i + 1 :]
        if shard_of(p, 8) == shard_of(q, 8)
    )
    shared = sum(
        assigned_shard(a, r, n_shards=8, seed=0) == assigned_shard(b, r, n_shards=8, seed=0)
        for r in range(1, 65)
    )
    assert shared < 32  # "fixed" would be 64 of 64; independent walks share ~1 in 8
    # four peers of a swarm, over a run: between them they train on more shards per round than
    # four fixed ids that collide would, and every shard gets its share of the rounds
    four = PEERS[:4]
    visits = torch.zeros(8, dtype=torch.int64)
    for r in range(1, 41):
        for p in four:
            visits[assigned_shard(p, r, n_shards=8, seed=0)] += 1
    assert int(visits.min()) >= 10 and int(visits.sum()) == 160  # 20 each if even


def test_an_unknown_assignment_is_refused_naming_the_field() -> None:
    with pytest.raises(TrainingConfigError, match=r"training\.data\.assignment 'random'"):
        TrainingConfig.for_run({"data": {"assignment": "random"}})
    with pytest.raises(TrainingConfigError, match="assignment"):
        assigned_shard("p", 1, n_shards=8, seed=0, assignment="random")


def test_a_record_without_the_assignment_is_a_fixed_run() -> None:
    assert TrainingConfig.for_run({}).data.assignment == "rotate"  # new runs rotate
    assert TrainingConfig.from_dict({}).data.assignment == "fixed"  # records from before did not
    assert TrainingConfig.from_dict({"data": {"n_shards": 4}}).data.assignment == "fixed"
    rotate = TrainingConfig.for_run({})
    assert rotate.to_dict()["data"]["assignment"] == "rotate"
    assert TrainingConfig.from_dict(rotate.to_dict()) == rotate
    fixed = TrainingConfig.for_run({"data": {"assignment": "fixed"}})
    assert "assignment" not in fixed.to_dict()["data"]  # fixed runs keep their recorded bytes
    assert TrainingConfig.from_dict(fixed.to_dict()) == fixed


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
