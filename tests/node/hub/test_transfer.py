"""Checkpoints to and from a Hub: the real huggingface_hub client against the local FakeHub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from cnode.node.hub import (
    HubError,
    HubLogin,
    HubLoginError,
    HubRevision,
    HubUnavailable,
    download_checkpoint,
    load_hub_login,
    upload_checkpoint,
)
from cnode.storage import (
    CID,
    BlockStore,
    CheckpointMeta,
    HFFolderError,
    export_car,
    missing_blocks,
    save_checkpoint,
)
from tests.support.fixtures import dead_endpoint, hf_hub  # noqa: F401 (fixtures)
from tests.support.hf_hub import FakeHub


def _checkpoint(store: BlockStore, seed: int = 0) -> CID:
    g = torch.Generator().manual_seed(seed)
    state = {
        "transformer.wte.weight": torch.randn(300, 1000, generator=g),  # two chunks
        "transformer.ln_f.bias": torch.randn(64, generator=g),
    }
    meta = CheckpointMeta(
        run_id="run-h",
        kind="checkpoint",
        round=3,
        model_config={"model_type": "gpt2", "n_layer": 1},
        tokenizer_files={"tokenizer.json": b'{"version": "1.0"}'},
    )
    return save_checkpoint(store, state, meta)


def _uploaded(hub: FakeHub, tmp_path: Path) -> tuple[BlockStore, CID, HubRevision]:
    store = BlockStore(tmp_path / "up")
    cid = _checkpoint(store)
    token = hub.add_user("alice", orgs=["acme"])
    where = upload_checkpoint(
        store,
        cid,
        repo="acme/run-h",
        token=token,
        message="cnode run-h round 3",
        workdir=tmp_path / "work",
        endpoint=hub.url,
    )
    return store, cid, where


def test_upload_then_verified_download_gives_the_same_checkpoint(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    store, cid, where = _uploaded(hf_hub, tmp_path)
    assert where.repo == "acme/run-h" and len(where.revision) == 40
    assert hf_hub.file("acme/run-h", "cnode-manifest.car", where.revision)
    fresh = BlockStore(tmp_path / "down")
    got = download_checkpoint(fresh, cid, where, workdir=tmp_path / "work", endpoint=hf_hub.url)
    assert got > 1_200_000  # the weights came over HTTP
    assert missing_blocks(fresh, cid) == [] and fresh.pins()[str(cid)] == cid
    export_car(store, cid, tmp_path / "a.car")
    export_car(fresh, cid, tmp_path / "b.car")
    assert (tmp_path / "a.car").read_bytes() == (tmp_path / "b.car").read_bytes()
    assert list((tmp_path / "work").iterdir()) == []  # temporary folders removed
    # a second upload of the same checkpoint is a new commit of the same files
    again = upload_checkpoint(
        store,
        cid,
        repo="acme/run-h",
        token=hf_hub.add_user("alice"),
        message="again",
        workdir=tmp_path / "work",
        endpoint=hf_hub.url,
    )
    assert again.revision != where.revision


def test_bytes_changed_on_the_hub_are_refused_and_nothing_is_pinned(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    _, cid, where = _uploaded(hf_hub, tmp_path)
    weights = bytearray(hf_hub.file(where.repo, "model.safetensors", where.revision))
    weights[-10] ^= 0xFF  # the last layer's last chunk
    hf_hub.tamper(where.repo, "model.safetensors", bytes(weights), where.revision)
    fresh = BlockStore(tmp_path / "down")
    with pytest.raises(HFFolderError, match="do not match the manifest's chunk"):
        download_checkpoint(fresh, cid, where, workdir=tmp_path / "work", endpoint=hf_hub.url)
    assert str(cid) not in fresh.pins() and missing_blocks(fresh, cid)


def test_a_commit_of_another_checkpoint_is_refused(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    store, _, where = _uploaded(hf_hub, tmp_path)
    other = _checkpoint(store, seed=1)
    with pytest.raises(HFFolderError, match=f"not the expected {other}"):
        download_checkpoint(
            BlockStore(tmp_path / "down"), other, where, workdir=tmp_path, endpoint=hf_hub.url
        )


def test_a_file_larger_than_the_manifest_allows_is_not_downloaded(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    _, cid, where = _uploaded(hf_hub, tmp_path)
    hf_hub.tamper(where.repo, "tokenizer.json", b"x" * 10_000, where.revision)
    with pytest.raises(HubError, match=r"tokenizer\.json of acme/run-h is 10000 bytes, over"):
        download_checkpoint(
            BlockStore(tmp_path / "down"), cid, where, workdir=tmp_path, endpoint=hf_hub.url
        )


@pytest.mark.parametrize(
    ("repo", "revision", "message"),
    [
        ("acme/nope", "main", "HTTP 404"),
        ("acme/run-h", "0" * 40, "HTTP 404: Invalid rev id"),
    ],
)
def test_unknown_repo_or_revision(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    repo: str,
    revision: str,
    message: str,
) -> None:
    _, cid, _ = _uploaded(hf_hub, tmp_path)
    with pytest.raises(HubUnavailable, match=message):
        download_checkpoint(
            BlockStore(tmp_path / "d"),
            cid,
            HubRevision(repo, revision),
            workdir=tmp_path,
            endpoint=hf_hub.url,
        )


def test_upload_without_write_access_says_so_and_never_shows_the_token(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    store = BlockStore(tmp_path / "s")
    cid = _checkpoint(store)
    token = hf_hub.add_user("bob")
    with pytest.raises(HubUnavailable, match="HTTP 403") as caught:
        upload_checkpoint(
            store,
            cid,
            repo="acme/run-h",
            token=token,
            message="m",
            workdir=tmp_path,
            endpoint=hf_hub.url,
        )
    assert token not in str(caught.value) and caught.value.__cause__ is None
    assert "acme/run-h" not in hf_hub.repos


def test_unreachable_hub(dead_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    store = BlockStore(tmp_path / "s")
    cid = _checkpoint(store)
    with pytest.raises(HubUnavailable, match="cannot reach the Hub"):
        download_checkpoint(
            store, cid, HubRevision("a/b", "0" * 40), workdir=tmp_path, endpoint=dead_endpoint
        )


def test_load_hub_login(tmp_path: Path) -> None:
    assert load_hub_login(tmp_path) is None  # never logged in
    token = tmp_path / "hf_token"
    token.write_text("hf_secret_value\n")
    os.chmod(token, 0o600)
    with pytest.raises(HubLoginError, match=r"hf_binding\.cbor is missing"):
        load_hub_login(tmp_path)
    (tmp_path / "hf_binding.cbor").write_bytes(b"\xa0")
    login = load_hub_login(tmp_path)
    assert login == HubLogin("hf_secret_value", b"\xa0")
    assert "hf_secret_value" not in repr(login)
    os.chmod(token, 0o644)
    with pytest.raises(HubLoginError, match="readable by others"):
        load_hub_login(tmp_path)
    token.write_text("  \n")
    os.chmod(token, 0o600)
    with pytest.raises(HubLoginError, match="is empty"):
        load_hub_login(tmp_path)
