from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from cnode.storage import (
    HF_MANIFEST_CAR,
    BlockStore,
    CheckpointMeta,
    HFFolderError,
    export_car,
    export_hf,
    import_hf,
    import_hf_verified,
    load_checkpoint,
    missing_blocks,
    read_manifest,
    read_tokenizer_files,
    save_checkpoint,
)

from .conftest import meta, small_state, snapshot

transformers = pytest.importorskip("transformers")


def _tiny_gpt2() -> tuple[Any, Any]:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval(), config


def _tokenizer_files(folder: Path) -> dict[str, bytes]:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(99)} | {"<unk>": 99}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.save_pretrained(folder)
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("tokenizer")}


@pytest.mark.slow
def test_export_loads_in_transformers_with_same_outputs(store: BlockStore, tmp_path: Path) -> None:
    model, config = _tiny_gpt2()
    files = _tokenizer_files(tmp_path / "tok")
    cid = save_checkpoint(
        store,
        model.state_dict(),
        CheckpointMeta(run_id="r", model_config=config.to_dict(), tokenizer_files=files),
    )
    out = export_hf(store, cid, tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "model.safetensors", "cnode-manifest.car", *files]
    )
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = torch.tensor([[1, 5, 7, 42, 99, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # tied
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("w1 w5")["input_ids"] == [1, 5]

    # and back: import --hf gives the same tensors and the same tokenizer files
    back = import_hf(store, out, run_id="again")
    tensors, manifest = load_checkpoint(store, back)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensors[name], tensor), name
    assert read_tokenizer_files(store, manifest) == files
    assert manifest.model_config == json.loads((out / "config.json").read_text())
    assert store.pins()[str(back)] == back


def test_import_of_hf_saved_folder(store: BlockStore, tmp_path: Path) -> None:
    model, _ = _tiny_gpt2()
    model.save_pretrained(tmp_path / "saved")  # transformers' own writer (drops tied lm_head)
    cid = import_hf(store, tmp_path / "saved")
    tensors, manifest = load_checkpoint(store, cid)
    assert manifest.extra["source"] == "hf" and manifest.model_config["n_layer"] == 2
    assert set(manifest.extra) == {"source", "unixfs"}
    state = model.state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(tensor, state[name]), name


def test_export_needs_model_config(store: BlockStore, tmp_path: Path) -> None:
    cid = save_checkpoint(store, {"w": torch.zeros(2)}, meta())
    with pytest.raises(HFFolderError, match="no model_config"):
        export_hf(store, cid, tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    cid2 = save_checkpoint(store, {"w": torch.zeros(2)}, meta(model_config={"a": 1}))
    with pytest.raises(HFFolderError, match="not an empty folder"):
        export_hf(store, cid2, tmp_path / "full")
    assert read_manifest(store, cid2).model_config == {"a": 1}


def _st(path: Path, header: Any, data: bytes) -> int:
    head = json.dumps(header).encode()
    return path.write_bytes(struct.pack("<Q", len(head)) + head + data)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "config.json"),
        (lambda d: (d / "config.json").write_text("{}"), "has no model.safetensors"),
        (
            lambda d: (
                (d / "config.json").write_text("{}"),
                (d / "pytorch_model.bin").write_bytes(b"x"),
            ),
            "pickle",
        ),
        (lambda d: (d / "config.json").write_text("{nope"), "not valid JSON"),
        (lambda d: (d / "config.json").write_text('{"x": NaN}'), "NaN is not allowed"),
        (
            lambda d: (
                (d / "config.json").write_text("{}"),
                _st(
                    d / "model.safetensors",
                    {"../w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                    bytes(4),
                ),
            ),
            "bad layer name",
        ),
        (
            lambda d: (
                (d / "config.json").write_text("{}"),
                _st(
                    d / "model.safetensors",
                    {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
                    bytes(4),
                ),
            ),
            "shape",
        ),
        (
            lambda d: (
                (d / "config.json").write_text("{}"),
                _st(
                    d / "model.safetensors",
                    {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                    bytes(4),
                ),
            ),
            "tensors need 8",
        ),
        (
            lambda d: (
                (d / "config.json").write_text("{}"),
                _st(
                    d / "model.safetensors",
                    {"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}},
                    bytes(8),
                ),
            ),
            "unsupported dtype",
        ),
        (
            lambda d: (
                (d / "config.json").write_text("{}"),
                (d / "model.safetensors").write_bytes(b"\xff" * 8),
            ),
            "too large",
        ),
    ],
)
def test_bad_hf_folders(store: BlockStore, tmp_path: Path, make, message) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "bad"
    folder.mkdir()
    make(folder)
    before = snapshot(store)
    with pytest.raises(HFFolderError, match=message):
        import_hf(store, folder)
    assert snapshot(store) == before


def test_duplicate_names_across_shards(store: BlockStore, tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    entry = {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    _st(folder / "a.safetensors", entry, bytes(4))
    _st(folder / "b.safetensors", entry, bytes(4))
    index = {"weight_map": {"w": "a.safetensors", "w2": "b.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    before = snapshot(store)
    with pytest.raises(HFFolderError, match="duplicate layer name 'w'"):
        import_hf(store, folder)
    assert snapshot(store) == before


def test_export_to_a_path_that_cannot_be_written_is_an_hf_error(
    store: BlockStore, tmp_path: Path
) -> None:
    cid = save_checkpoint(store, {"w": torch.zeros(2)}, meta(model_config={"a": 1}))
    (tmp_path / "file").write_text("x")
    with pytest.raises(HFFolderError, match=r"cannot write .*file/out: Not a directory"):
        export_hf(store, cid, tmp_path / "file" / "out")


def _exported(store: BlockStore, tmp_path: Path) -> tuple[Any, Path]:
    files = {"tokenizer.json": b'{"model": "x"}' * 5000}  # 75 kB side file
    cid = save_checkpoint(
        store, small_state(), meta(model_config={"model_type": "gpt2"}, tokenizer_files=files)
    )
    return cid, export_hf(store, cid, tmp_path / "hf")


def test_verified_import_rebuilds_exactly_the_manifest(store: BlockStore, tmp_path: Path) -> None:
    cid, folder = _exported(store, tmp_path)
    fresh = BlockStore(tmp_path / "fresh")
    import_hf_verified(fresh, folder, cid)
    assert missing_blocks(fresh, cid) == []
    assert fresh.pins()[str(cid)] == cid
    tensors, _ = load_checkpoint(fresh, cid)
    for name, tensor in small_state().items():
        assert torch.equal(tensors[name], tensor), name
    # a CAR export of the rebuilt store is byte-identical to the original's
    export_car(store, cid, tmp_path / "a.car")
    export_car(fresh, cid, tmp_path / "b.car")
    assert (tmp_path / "a.car").read_bytes() == (tmp_path / "b.car").read_bytes()


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _tensor_offset(folder: Path, name: str) -> int:
    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return 8 + n + json.loads(raw[8 : 8 + n])[name]["data_offsets"][0]


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        # one bit of the second 1 MiB slice of a tensor
        (
            lambda d: _flip_byte(
                d / "model.safetensors", _tensor_offset(d, "embed.weight") + (1 << 20) + 5
            ),
            r"'embed.weight': bytes 1048576\.\. do not match the manifest's chunk",
        ),
        (lambda d: _flip_byte(d / "tokenizer.json", 10), "tokenizer.json: bytes 0.. do not match"),
        (lambda d: (d / HF_MANIFEST_CAR).unlink(), "cannot read .*cnode-manifest.car"),
        (lambda d: (d / "model.safetensors").unlink(), "cannot read .*model.safetensors"),
        (lambda d: (d / HF_MANIFEST_CAR).write_bytes(b"\x05hello"), "cnode-manifest.car: "),
        (lambda d: (d / "tokenizer.json").write_bytes(b"{}"), "tokenizer.json is not the manif"),
    ],
    ids=["tensor-bit", "tokenizer-bit", "no-manifest-car", "no-weights", "bad-car", "short-file"],
)
def test_verified_import_refuses_bytes_that_are_not_the_manifests(
    store: BlockStore,
    tmp_path: Path,
    spoil,
    message,  # type: ignore[no-untyped-def]
) -> None:
    cid, folder = _exported(store, tmp_path)
    spoil(folder)
    fresh = BlockStore(tmp_path / "fresh")
    with pytest.raises(HFFolderError, match=message):
        import_hf_verified(fresh, folder, cid)
    assert str(cid) not in fresh.pins()
    # every block stored on the way verified against its CID: nothing wrong was kept
    for path in (fresh.root / "blocks").rglob("*"):
        if path.is_file():
            assert fresh.get(_cid_of(path)) == path.read_bytes()


def _cid_of(path: Path) -> Any:
    from cnode.storage import CID

    return CID.parse(path.name)


def test_verified_import_refuses_another_checkpoints_folder(
    store: BlockStore, tmp_path: Path
) -> None:
    cid, _ = _exported(store, tmp_path)
    other = save_checkpoint(store, small_state(seed=1), meta(model_config={"model_type": "gpt2"}))
    folder = export_hf(store, other, tmp_path / "other")
    with pytest.raises(HFFolderError, match=f"is the manifest {other}, not the expected {cid}"):
        import_hf_verified(BlockStore(tmp_path / "fresh"), folder, cid)


def _nan_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "nan"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    good = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    bad = struct.pack("<2e", float("nan"), float("inf"))
    header = {
        "ok": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "bad": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]},
        "ints": {"dtype": "I32", "shape": [1], "data_offsets": [20, 24]},
    }
    _st(folder / "model.safetensors", header, good + bad + struct.pack("<i", -1))
    return folder


def test_nonfinite_tensors_are_refused_by_name(store: BlockStore, tmp_path: Path) -> None:
    folder = _nan_folder(tmp_path)
    with pytest.raises(HFFolderError, match=r"tensor model.safetensors:bad holds 2 NaN/Inf"):
        import_hf(store, folder)
    assert store.pins() == {}


def test_nonfinite_tensors_imported_with_a_warning_when_allowed(
    store: BlockStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import math
    import sys

    import structlog

    from cnode.storage import _hf

    # Whatever an earlier test configured (a level filter, stderr): start from the defaults,
    # print JSON lines to this test's captured stdout, with a logger made under it.
    structlog.reset_defaults()
    structlog.configure(
        processors=[structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=False,
    )
    monkeypatch.setattr(_hf, "log", structlog.get_logger(_hf.__name__))
    try:
        cid = import_hf(store, _nan_folder(tmp_path), allow_nonfinite=True)
    finally:
        structlog.reset_defaults()
    state, _ = load_checkpoint(store, cid)
    assert math.isinf(float(state["bad"][1])) and float(state["ok"][3]) == 4.0
    out = capsys.readouterr().out
    assert "hf_nonfinite_tensor" in out and "model.safetensors:bad" in out
