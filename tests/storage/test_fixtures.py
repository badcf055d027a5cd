"""The bytes in specs/fixtures/manifest/ pin the format: today's code must produce exactly them.

Regenerate (only on a deliberate, versioned format change) with
``.venv/bin/python -m tests.storage.test_fixtures``. It writes ``unixfs.car``/``unixfs.json``
(today's format: the checkpoint records its UnixFS view) and ``raw_cids.json``.
``small.car``, ``small.json`` and ``bad_manifests.json`` are frozen: written before manifests
recorded a UnixFS view (``extra.unixfs``), they prove such manifests stay readable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from cnode.storage import (
    CID,
    AggregationRecord,
    BlockStore,
    CheckpointMeta,
    StorageError,
    compute_cid,
    export_car,
    import_car,
    load_checkpoint,
    read_manifest,
    recorded_unixfs_root,
    save_checkpoint,
    unixfs_view,
    verify_checkpoint,
)
from cnode.storage._cbor import decode

FIXTURES = Path(__file__).resolve().parents[2] / "specs" / "fixtures" / "manifest"


def fixture_state() -> dict[str, torch.Tensor]:
    return {
        "embed.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4,
        "h.0.bias": torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "count": torch.tensor(-7, dtype=torch.int64),
    }


def fixture_meta() -> CheckpointMeta:
    update = compute_cid(b"\xa0", 0x71)  # stands for a signed update's manifest
    return CheckpointMeta(
        run_id="fixture-run",
        epoch=1,
        round=2,
        step=3,
        model_config={"model_type": "gpt2", "n_layer": 1, "layer_norm_epsilon": 1e-05},
        tokenizer_files={"vocab.json": b'{"a": 0, "b": 1}'},
        aggregation=AggregationRecord("centered_clip", {"tau": 1.0, "iters": 3}, [update]),
        extra={"note": "fixture"},
    )


def test_fixture_car_imports_and_matches(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "small.json").read_text())
    store = BlockStore(tmp_path / "s")
    root = import_car(store, FIXTURES / "small.car")
    assert str(root) == expected["manifest"]
    assert store.get(root).hex() == expected["manifest_block_hex"]
    tensors, manifest = load_checkpoint(store, root)
    for layer, want in zip(manifest.layers, expected["layers"], strict=True):
        assert [layer.name, layer.dtype, list(layer.shape), layer.nbytes] == [
            want["name"], want["dtype"], want["shape"], want["nbytes"],
        ]  # fmt: skip
        assert [str(c) for c in layer.chunks] == want["chunks"]
        assert tensors[layer.name].to(torch.float64).flatten().tolist() == want["values"]


def test_saving_the_same_state_today_gives_the_fixture_cid(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "unixfs.json").read_text())
    store = BlockStore(tmp_path / "s")
    cid = save_checkpoint(store, fixture_state(), fixture_meta())
    assert str(cid) == expected["manifest"]
    assert store.get(cid).hex() == expected["manifest_block_hex"]
    view = unixfs_view(store, cid)
    assert str(view.root) == expected["unixfs"]
    assert [[str(c), d.hex()] for c, d in view.blocks] == expected["view_blocks"]
    assert {n: str(c) for n, c in view.files.items()} == expected["files"]


def test_unixfs_fixture_imports_and_verifies(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "unixfs.json").read_text())
    store = BlockStore(tmp_path / "s")
    root = import_car(store, FIXTURES / "unixfs.car")
    manifest = read_manifest(store, root)
    assert str(recorded_unixfs_root(manifest.extra)) == expected["unixfs"]
    report = verify_checkpoint(store, root)
    assert report.ok and not any("UnixFS" in note for note in report.notes)


def test_frozen_manifest_without_a_view_stays_valid(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "s")
    root = import_car(store, FIXTURES / "small.car")
    assert recorded_unixfs_root(read_manifest(store, root).extra) is None
    report = verify_checkpoint(store, root)
    assert report.ok
    assert "no UnixFS view recorded (a manifest from an older cnode)" in report.notes


def test_raw_cid_vectors() -> None:
    for vector in json.loads((FIXTURES / "raw_cids.json").read_text()):
        assert str(compute_cid(bytes.fromhex(vector["bytes_hex"]))) == vector["cid"]


@pytest.mark.parametrize(
    "case", json.loads((FIXTURES / "bad_manifests.json").read_text()), ids=lambda c: c["name"]
)
def test_bad_manifest_fixtures(tmp_path: Path, case: dict[str, Any]) -> None:
    store = BlockStore(tmp_path / "s")
    data = bytes.fromhex(case["hex"])
    cid = CID(0x71, __import__("hashlib").sha256(data).digest())
    store._adopt(cid, _write(tmp_path / "node", data))  # planted as if a peer had stored it
    with pytest.raises(StorageError, match=case["error"]):
        read_manifest(store, cid)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _bad_cases(root_hex: str) -> list[dict[str, str]]:
    """How bad_manifests.json was made from small.car's root (frozen; kept as its record)."""
    import dag_cbor

    root: Any = dag_cbor.decode(bytes.fromhex(root_hex))

    def variant(**changes: Any) -> str:
        return dag_cbor.encode({**root, **changes}).hex()

    layer0 = dict(root["layers"][0])
    layers_rest = root["layers"][1:]
    return [
        {"name": "truncated", "hex": root_hex[:-10], "error": "malformed DAG-CBOR"},
        {"name": "unsorted-keys", "hex": "a2616201616101", "error": "non-canonical"},
        {"name": "non-minimal-int", "hex": "1801", "error": "non-canonical"},
        {"name": "nan", "hex": "fb7ff8000000000000", "error": "NaN"},
        {"name": "version-2", "hex": variant(version=2), "error": "version 2 not supported"},
        {
            "name": "shape-times-dtype",
            "hex": variant(layers=[{**layer0, "shape": [4, 4]}, *layers_rest]),
            "error": "is 64 bytes but size says 48",
        },
        {
            "name": "duplicate-layer",
            "hex": variant(layers=[layer0, layer0, *layers_rest[1:]]),
            "error": "duplicate layer name",
        },
        {
            "name": "path-like-name",
            "hex": variant(layers=[{**layer0, "name": "../../etc/passwd"}, *layers_rest]),
            "error": "bad layer name",
        },
    ]


def regenerate() -> None:
    import tempfile

    FIXTURES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = BlockStore(Path(tmp))
        cid = save_checkpoint(store, fixture_state(), fixture_meta())
        export_car(store, cid, FIXTURES / "unixfs.car")
        view = unixfs_view(store, cid)
        description = {
            "about": "unixfs.car: the checkpoint of small.car saved with its UnixFS view "
            "(specs/manifest.md#unixfs-view); view_blocks = [CID, hex] of the blocks the view "
            "adds, directory first; files = the directory's entries",
            "manifest": str(cid),
            "manifest_block_hex": store.get(cid).hex(),
            "manifest_decoded": repr(decode(store.get(cid))),
            "unixfs": str(view.root),
            "files": {name: str(c) for name, c in view.files.items()},
            "view_blocks": [[str(c), d.hex()] for c, d in view.blocks],
        }
        (FIXTURES / "unixfs.json").write_text(json.dumps(description, indent=2) + "\n")
        vectors = [
            {"bytes_hex": b.hex(), "cid": str(compute_cid(b)), "note": note}
            for b, note in [
                (b"hello world", "ipfs add --raw-leaves --cid-version 1"),
                (b"", "the empty raw block"),
                (b"hello world\n", "with a newline"),
            ]
        ]
        (FIXTURES / "raw_cids.json").write_text(json.dumps(vectors, indent=2) + "\n")


if __name__ == "__main__":
    regenerate()
