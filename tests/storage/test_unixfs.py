"""storage/_unixfs.py: a checkpoint's UnixFS view, read back by the JS reference.

specs/manifest.md#unixfs-view.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cnode.storage import (
    BlockStore,
    CheckpointMeta,
    compute_cid,
    export_car,
    export_hf,
    limits,
    read_manifest,
    recorded_unixfs_root,
    save_checkpoint,
    unixfs_view,
    verify_car,
    verify_checkpoint,
)
from cnode.storage._cid import DAG_PB
from cnode.storage._dagpb import decode_node
from tests.support.js import unpack_car

from .conftest import meta, small_state

transformers = pytest.importorskip("transformers")


def _leaves_bytes(store: BlockStore, cid_text: str) -> bytes:
    """A UnixFS file's bytes, walked with our own decoder (independent of the builder)."""
    from cnode.storage import CID

    cid = CID.parse(cid_text)
    if cid.codec != DAG_PB:
        return store.get(cid)
    links, _ = decode_node(store.get(cid))
    return b"".join(_leaves_bytes(store, str(link.cid)) for link in links)


@pytest.mark.slow
def test_js_reference_unpacks_a_folder_from_pretrained_loads(
    store: BlockStore, tmp_path: Path
) -> None:
    from .test_hf import _tiny_gpt2, _tokenizer_files

    model, config = _tiny_gpt2()
    files = _tokenizer_files(tmp_path / "tok")
    cid = save_checkpoint(
        store,
        model.state_dict(),
        CheckpointMeta(run_id="r", model_config=config.to_dict(), tokenizer_files=files),
    )
    root = recorded_unixfs_root(read_manifest(store, cid).extra)
    assert root is not None and root == unixfs_view(store, cid).root
    car = tmp_path / "ckpt.car"
    export_car(store, cid, car)
    assert verify_car(car).ok
    out = tmp_path / "ipfs-get"
    result = unpack_car(car, str(root), out)
    assert sorted(result["files"]) == sorted(["config.json", "model.safetensors", *files])
    hf = export_hf(store, cid, tmp_path / "hf")
    for name in ["config.json", *files]:
        assert (out / name).read_bytes() == (hf / name).read_bytes(), name
    view = unixfs_view(store, cid)
    weights = (out / "model.safetensors").read_bytes()
    assert weights == _leaves_bytes(store, str(view.files["model.safetensors"]))
    # Same tensor bytes as export --hf; only the header's metadata differs (no manifest CID).
    hf_weights = (hf / "model.safetensors").read_bytes()
    n_js, n_hf = (int.from_bytes(w[:8], "little") for w in (weights, hf_weights))
    assert weights[8 + n_js :] == hf_weights[8 + n_hf :]
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = torch.tensor([[1, 5, 7, 42, 99, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert transformers.AutoTokenizer.from_pretrained(out)("w1 w5")["input_ids"] == [1, 5]


def test_no_tensor_byte_is_stored_twice(store: BlockStore) -> None:
    state = small_state()
    cid = save_checkpoint(store, state, meta())
    view = unixfs_view(store, cid)
    chunks = {c for layer in read_manifest(store, cid).layers for c in layer.chunks}
    added = {c for c, _ in view.blocks}
    assert not added & chunks
    header = [data for c, data in view.blocks if c.codec != DAG_PB]
    assert len(header) == 1 and json.loads(header[0][8:])["__metadata__"] == {"format": "pt"}


def test_deep_file_tree_reads_back_byte_for_byte(
    store: BlockStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "UNIXFS_FANOUT", 3)  # 3 links per node: 4 levels for 8 leaves
    state = {"a": torch.arange(600_000, dtype=torch.float32), "b": torch.ones(7)}
    cid = save_checkpoint(store, state, meta(tokenizer_files={"empty.txt": b""}))
    view = unixfs_view(store, cid)
    for _cid, data in view.blocks:
        if _cid.codec == DAG_PB:
            assert len(decode_node(data)[0]) <= 3
    car = tmp_path / "deep.car"
    export_car(store, cid, car)
    result = unpack_car(car, str(view.root), tmp_path / "out")
    weights = _leaves_bytes(store, str(view.files["model.safetensors"]))
    assert result["files"] == {"model.safetensors": len(weights), "empty.txt": 0}
    body = (tmp_path / "out" / "model.safetensors").read_bytes()
    n = int.from_bytes(body[:8], "little")
    assert body[8 + n :] == state["a"].numpy().tobytes() + state["b"].numpy().tobytes()
    assert verify_checkpoint(store, cid).ok


def test_verify_names_a_missing_view_block(store: BlockStore) -> None:
    cid = save_checkpoint(store, small_state(), meta())
    header = next(c for c, _ in unixfs_view(store, cid).blocks if c.codec != DAG_PB)
    store.delete(header)
    report = verify_checkpoint(store, cid)
    assert [f.kind for f in report.faults] == ["unixfs-missing"]


def test_verify_names_a_recorded_view_that_is_not_the_manifests(store: BlockStore) -> None:
    other = compute_cid(b"\x0a\x02\x08\x01", DAG_PB)
    cid = save_checkpoint(store, small_state(), meta(kind="update", extra={"unixfs": other}))
    report = verify_checkpoint(store, cid)
    assert [f.kind for f in report.faults] == ["unixfs-mismatch"]
    assert str(other) in report.faults[0].message


def test_updates_get_no_view(store: BlockStore) -> None:
    cid = save_checkpoint(store, small_state(), meta(kind="update"))
    assert recorded_unixfs_root(read_manifest(store, cid).extra) is None
    assert verify_checkpoint(store, cid).notes == []
