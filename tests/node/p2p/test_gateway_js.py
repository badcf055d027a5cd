"""An independent IPFS client, the JS reference @helia/verified-fetch, fetches and verifies a
checkpoint's blocks, files and CAR from a cnode gateway (HTTP only: the gateway is its one
provider). Installed by ``make test`` (tests/js)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cnode.node.p2p import RunningGateway
from cnode.storage import (
    CID,
    DAG_PB,
    BlockStore,
    CheckpointMeta,
    block_links,
    compute_cid,
    manifest_closure,
    read_car,
    save_checkpoint,
    unixfs_view,
)
from tests.support.http import gateway_thread
from tests.support.js import verified_fetch

Held = tuple[BlockStore, CID, RunningGateway]


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Held]:
    store = BlockStore(tmp_path_factory.mktemp("js") / "blocks")
    state = {"w": torch.randn(700_000), "b": torch.arange(5)}
    meta = CheckpointMeta(run_id="js", model_config={"model_type": "gpt2"})
    root = save_checkpoint(store, state, meta)
    with gateway_thread(store) as gateway:
        yield store, root, gateway


def _file_bytes(store: BlockStore, cid: CID) -> bytes:
    """A UnixFS file's bytes, walked with the gateway's own link reader."""
    if cid.codec != DAG_PB:
        return store.get(cid)
    return b"".join(_file_bytes(store, link) for link in block_links(cid, store.get(cid)))


def test_verified_fetch_reads_a_file_of_the_unixfs_view(held: Held, tmp_path: Path) -> None:
    store, root, gateway = held
    view = unixfs_view(store, root)
    out = tmp_path / "model.safetensors"
    result = verified_fetch(gateway.url, str(view.root), "model.safetensors", out)
    assert result["status"] == 200
    assert out.read_bytes() == _file_bytes(store, view.files["model.safetensors"])


def test_verified_fetch_gets_a_raw_block_and_a_car(held: Held, tmp_path: Path) -> None:
    store, root, gateway = held
    raw = tmp_path / "manifest.bin"
    result = verified_fetch(gateway.url, str(root), "", raw, "application/vnd.ipld.raw")
    assert result["status"] == 200 and raw.read_bytes() == store.get(root)
    car = tmp_path / "ckpt.car"
    result = verified_fetch(gateway.url, str(root), "", car, "application/vnd.ipld.car")
    assert result["status"] == 200 and result["contentType"].startswith("application/vnd.ipld.car")
    roots, sections = read_car(car.read_bytes(), max_sections=10_000)
    assert roots == [root]
    assert all(compute_cid(data, cid.codec) == cid for cid, data in sections)
    assert {cid for cid, _ in sections} == set(manifest_closure(store, root))
