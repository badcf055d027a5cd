"""download_file: one file of a model or dataset repo at a commit, bounded and cached (FakeHub)."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest
from huggingface_hub import HfApi

from cnode.node.hub import HubError, HubUnavailable, download_file
from tests.support.fixtures import dead_endpoint, hf_hub  # noqa: F401 (fixtures)
from tests.support.hf_hub import FakeHub


@pytest.fixture(autouse=True)
def _own_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads its cache folder from this module attribute at every call.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def _upload(hub: FakeHub, repo: str, repo_type: str, data: bytes) -> str:
    api = HfApi(endpoint=hub.url, token=hub.add_user("alice", orgs=["acme"]))
    api.create_repo(repo, repo_type=repo_type)
    info = api.upload_file(
        path_or_fileobj=data, path_in_repo="data/part-0.txt", repo_id=repo, repo_type=repo_type
    )
    return str(info.oid)


def test_a_dataset_file_and_a_model_file_of_the_same_name_stay_apart(
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    dataset = _upload(hf_hub, "acme/same", "dataset", b"dataset bytes")
    model = _upload(hf_hub, "acme/same", "model", b"model bytes")
    assert set(hf_hub.datasets) == set(hf_hub.repos) == {"acme/same"}
    got = download_file(
        "acme/same",
        "data/part-0.txt",
        repo_type="dataset",
        revision=dataset,
        max_bytes=100,
        endpoint=hf_hub.url,
    )
    assert got.read_bytes() == b"dataset bytes"
    got = download_file(
        "acme/same", "data/part-0.txt", revision=model, max_bytes=100, endpoint=hf_hub.url
    )
    assert got.read_bytes() == b"model bytes"
    assert hf_hub.file("acme/same", "data/part-0.txt", dataset, kind="datasets") == b"dataset bytes"


def test_a_cached_commit_is_used_without_asking_the_hub(
    hf_hub: FakeHub,  # noqa: F811
    dead_endpoint: str,  # noqa: F811
) -> None:
    sha = _upload(hf_hub, "acme/text", "dataset", b"pinned")

    def fetch(endpoint: str) -> Path:
        return download_file(
            "acme/text",
            "data/part-0.txt",
            repo_type="dataset",
            revision=sha,
            max_bytes=100,
            endpoint=endpoint,
        )

    first = fetch(hf_hub.url)
    again = fetch(dead_endpoint)  # nothing listens there: the cache answered
    assert first == again and again.read_bytes() == b"pinned"


def test_a_file_over_the_limit_is_refused_before_it_is_downloaded(
    hf_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
) -> None:
    sha = _upload(hf_hub, "acme/text", "dataset", b"x" * 1000)
    hf_hub.requests.clear()
    with pytest.raises(HubError, match=r"data/part-0\.txt of acme/text is 1000 bytes, over"):
        download_file(
            "acme/text",
            "data/part-0.txt",
            repo_type="dataset",
            revision=sha,
            max_bytes=999,
            endpoint=hf_hub.url,
        )
    assert [m for m, _, _ in hf_hub.requests] == ["HEAD"]


@pytest.mark.parametrize(
    ("repo", "filename", "message"),
    [
        ("acme/nope", "data/part-0.txt", "HTTP 404: Repository not found"),
        ("acme/text", "data/nope.txt", "HTTP 404: Entry not found"),
    ],
)
def test_unknown_dataset_or_file(
    hf_hub: FakeHub,  # noqa: F811
    repo: str,
    filename: str,
    message: str,
) -> None:
    sha = _upload(hf_hub, "acme/text", "dataset", b"text")
    with pytest.raises(HubUnavailable, match=message):
        download_file(
            repo, filename, repo_type="dataset", revision=sha, max_bytes=100, endpoint=hf_hub.url
        )
