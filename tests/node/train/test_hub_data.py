"""A Hub dataset file as the corpus, and a Hub model id as the model, against the local FakeHub.

The real huggingface_hub client (and, for the model, transformers) talks to FakeHub: in this
process through ``$HF_ENDPOINT``, which cnode reads at every call, with huggingface_hub's cache
moved under ``tmp_path``; for the model, in a subprocess with a fresh ``HF_HOME``, because
transformers and huggingface_hub read those once, at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from huggingface_hub import HfApi
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from cnode.node.train import TextData, TrainingConfig, TrainingConfigError, model_state
from cnode.node.train import limits as train_limits
from cnode.node.train.model._data import load_corpus_text, train_tokenizer
from tests.support.fixtures import dead_endpoint, hf_hub  # noqa: F401 (fixtures)
from tests.support.hf_hub import FakeHub

ROOT = Path(__file__).resolve().parents[3]
DATASET = "acme/tiny-text"
TEXT = "the quick brown fox jumps over the lazy dog. " * 2000


@pytest.fixture(autouse=True)
def _hub_client_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's cache under tmp_path, and no token of this machine sent anywhere."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)


def _upload_text(hub: FakeHub, data: bytes, path: str = "data/corpus.txt") -> str:
    """Upload ``data`` as ``path`` of dataset DATASET; the commit sha that holds it."""
    api = HfApi(endpoint=hub.url, token=hub.add_user("alice", orgs=["acme"]))
    api.create_repo(DATASET, repo_type="dataset", exist_ok=True)
    info = api.upload_file(
        path_or_fileobj=data, path_in_repo=path, repo_id=DATASET, repo_type="dataset"
    )
    return str(info.oid)


def _config(corpus: str) -> TrainingConfig:
    return TrainingConfig.from_dict(
        {"model": {"vocab_size": 300}, "data": {"corpus": corpus, "eval_sequences": 4}}
    )


def test_a_pinned_hub_dataset_file_is_the_corpus(
    hf_hub: FakeHub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sha = _upload_text(hf_hub, TEXT.encode())
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    corpus = f"hf://datasets/{DATASET}/data/corpus.txt@{sha}"
    assert load_corpus_text(corpus) == TEXT
    # huggingface_hub's own spelling names the same file
    assert load_corpus_text(f"hf://datasets/{DATASET}@{sha}/data/corpus.txt") == TEXT

    hf_hub.requests.clear()
    config = _config(corpus)
    data = TextData.build(config.data, config.model)
    local = train_tokenizer(TEXT, 300)
    assert data.tokenizer_json == local.to_str()  # trained on the very same text
    assert data.train.shape[1] == 64 and int(data.train.max()) < 300
    assert hf_hub.requests == []  # the commit's file came from the cache, not the Hub again


def test_an_unpinned_or_malformed_hub_corpus_is_refused_before_any_download() -> None:
    base = f"hf://datasets/{DATASET}/data/corpus.txt"
    for corpus in (f"{base}@main", base, f"{base}@{'A' * 40}"):
        with pytest.raises(TrainingConfigError, match="pin a commit") as caught:
            _config(corpus)
        assert corpus in str(caught.value)
    # (hf://datasets/OWNER/NAME@COMMIT, without a path, is a whole dataset: test_datasets.py.)
    for corpus in ("hf://acme/tiny-text/corpus.txt", f"hf://datasets/{DATASET}"):
        with pytest.raises(TrainingConfigError, match="hf://datasets/OWNER/NAME/PATH@COMMIT"):
            _config(corpus)
    with pytest.raises(TrainingConfigError, match="not a dataset repo id and file path"):
        _config(f"hf://datasets/{DATASET}/../x.txt@{'0' * 40}")


def test_an_unpinned_or_malformed_hub_model_is_refused_before_any_download() -> None:
    for pretrained, message in (
        ("acme/tiny-gpt2", "no revision; pin a commit"),
        ("acme/tiny-gpt2@main", "revision 'main' is not a commit"),
        ("tiny-gpt2@" + "0" * 40, "a Hub model is OWNER/NAME@COMMIT"),
    ):
        with pytest.raises(TrainingConfigError, match=message):
            TrainingConfig.from_dict({"model": {"pretrained": pretrained}})


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("acme/nope/data/corpus.txt@{sha}", "HTTP 404: Repository not found"),
        (DATASET + "/data/corpus.txt@" + "0" * 40, "HTTP 404: Invalid rev id"),
        (DATASET + "/data/other.txt@{sha}", "HTTP 404: Entry not found"),
    ],
)
def test_an_unknown_dataset_commit_or_file_is_a_one_line_config_error(
    hf_hub: FakeHub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    message: str,
) -> None:
    sha = _upload_text(hf_hub, TEXT.encode())
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    corpus = "hf://datasets/" + where.format(sha=sha)
    with pytest.raises(TrainingConfigError, match=message) as caught:
        load_corpus_text(corpus)
    text = str(caught.value)
    assert text.startswith(f"cannot load corpus {corpus}: ") and "\n" not in text
    assert caught.value.__cause__ is None


def test_a_corpus_over_the_limit_is_not_downloaded(
    hf_hub: FakeHub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sha = _upload_text(hf_hub, b"x" * 5000)
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    monkeypatch.setattr(train_limits, "MAX_CORPUS_BYTES", 4999)
    hf_hub.requests.clear()
    with pytest.raises(TrainingConfigError, match="is 5000 bytes, over the limit of 4999"):
        load_corpus_text(f"hf://datasets/{DATASET}/data/corpus.txt@{sha}")
    assert [method for method, _, _ in hf_hub.requests] == ["HEAD"]


def test_a_corpus_that_is_not_utf8_is_refused(
    hf_hub: FakeHub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sha = _upload_text(hf_hub, b"caf\xe9 au lait")
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    with pytest.raises(TrainingConfigError, match=r"not UTF-8 text \(byte 3\)"):
        load_corpus_text(f"hf://datasets/{DATASET}/data/corpus.txt@{sha}")


def test_an_unreachable_hub_or_a_refused_token_never_shows_the_token(
    hf_hub: FakeHub,  # noqa: F811
    dead_endpoint: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sha = _upload_text(hf_hub, TEXT.encode())
    corpus = f"hf://datasets/{DATASET}/data/corpus.txt@{sha}"
    token = hf_hub.add_user("bob")
    hf_hub.revoke(token)
    monkeypatch.setenv("HF_TOKEN", token)  # huggingface_hub sends the machine's token
    monkeypatch.setenv("HF_ENDPOINT", dead_endpoint)
    with pytest.raises(TrainingConfigError, match="cannot reach the Hub at http") as caught:
        load_corpus_text(corpus)
    assert token not in str(caught.value)
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    with pytest.raises(TrainingConfigError, match="HTTP 401") as caught:
        load_corpus_text(corpus)
    assert token not in str(caught.value) and caught.value.__cause__ is None


_LOAD_IN_A_FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    from safetensors.torch import save_file
    from cnode.node.train import TextData, TrainingConfig, build_model, model_state, train_local

    config = TrainingConfig.from_dict(json.loads(sys.argv[1]))
    model = build_model(config)
    data = TextData.build(config.data, config.model)
    save_file(model_state(model), sys.argv[2] + "/state.safetensors")
    result = train_local(model, model_state(model), data, config, peer_id="p", round_=1)
    report = {
        "tokenizer": data.tokenizer_json,
        "max_id": int(data.train.max()),
        "loss": result.loss_first,
    }
    open(sys.argv[2] + "/report.json", "w").write(json.dumps(report))
    """
)


@pytest.mark.slow
def test_a_hub_model_id_loads_its_weights_and_tokenizer(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    # A tiny GPT-2 and its tokenizer, as someone would publish them with transformers.
    tokenizer = train_tokenizer(TEXT, 300)
    torch.manual_seed(7)
    gpt2 = GPT2Config(
        n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=300, bos_token_id=0
    )
    gpt2.eos_token_id = 0
    uploaded = GPT2LMHeadModel(gpt2)
    folder = tmp_path / "tiny-gpt2"
    uploaded.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(folder)
    api = HfApi(endpoint=hf_hub.url, token=hf_hub.add_user("alice", orgs=["acme"]))
    api.create_repo("acme/tiny-gpt2")
    model_sha = api.upload_folder(repo_id="acme/tiny-gpt2", folder_path=folder).oid
    sha = _upload_text(hf_hub, TEXT.encode())

    training = {
        "model": {"pretrained": f"acme/tiny-gpt2@{model_sha}"},
        "data": {"corpus": f"hf://datasets/{DATASET}/data/corpus.txt@{sha}", "eval_sequences": 4},
        "local_steps": 1,
        "batch_size": 2,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hf_hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="0")
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_A_FRESH_PROCESS, json.dumps(training), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    loaded = load_file(tmp_path / "state.safetensors")
    expected = model_state(uploaded)
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[name], expected[name]) for name in expected)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tokenizer"] == tokenizer.to_str()  # the model's own, not one trained here
    assert report["max_id"] < 300 and report["loss"] > 0
    fetched = {path for method, path, _ in hf_hub.requests if method == "GET"}
    assert f"/datasets/{DATASET}/resolve/{sha}/data/corpus.txt" in fetched
    assert any(p.startswith("/acme/tiny-gpt2/resolve/") for p in fetched), fetched
