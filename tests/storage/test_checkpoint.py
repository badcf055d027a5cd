from __future__ import annotations

import pytest
import torch

from cnode.storage import (
    CID,
    DAG_CBOR,
    RAW,
    AggregationRecord,
    BlockNotFoundError,
    BlockStore,
    CheckpointError,
    CheckpointMeta,
    ManifestError,
    ManifestLayout,
    compute_cid,
    limits,
    load_checkpoint,
    missing_blocks,
    read_manifest,
    read_tokenizer_files,
    save_checkpoint,
    unixfs_view,
)
from cnode.storage._cbor import decode, encode

from .conftest import meta, small_state, snapshot

ALL_DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
]  # fmt: skip


def test_round_trip_every_dtype(store: BlockStore) -> None:
    state = {
        f"t.{str(d).split('.')[-1]}": (torch.arange(60) % 3).to(d).reshape(3, 4, 5)
        for d in ALL_DTYPES
    }
    state["scalar"] = torch.tensor(3.5)
    state["empty"] = torch.zeros(0, 7)
    state["strided"] = torch.arange(20.0).reshape(4, 5).t()  # non-contiguous
    files = {"tokenizer.json": b'{"v": 1}', "merges.txt": b"a b\n" * 400_000}  # 1.6 MB: 2 chunks
    cid = save_checkpoint(
        store, state, meta(model_config={"n_layer": 2, "eps": 1e-5}, tokenizer_files=files)
    )
    assert cid.codec == DAG_CBOR
    loaded, manifest = load_checkpoint(store, cid)
    assert list(loaded) == list(state)
    for name, tensor in state.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    assert manifest.run_id == "run-a" and (manifest.epoch, manifest.round, manifest.step) == (
        1,
        2,
        30,
    )
    assert manifest.model_config == {"n_layer": 2, "eps": 1e-5}
    assert read_tokenizer_files(store, manifest) == files
    assert missing_blocks(store, cid) == []


def test_chunks_are_little_endian_bytes_and_same_cid_as_ipfs(store: BlockStore) -> None:
    t = torch.arange(300_000, dtype=torch.float32)  # 1.2 MB -> chunks of 1 MiB + rest
    cid = save_checkpoint(store, {"w": t}, meta())
    layer = read_manifest(store, cid).layers[0]
    raw = t.numpy().astype("<f4").tobytes()
    assert layer.nbytes == len(raw) and len(layer.chunks) == 2
    assert layer.chunks[0] == compute_cid(raw[: limits.CHUNK_SIZE], RAW)
    assert layer.chunks[1] == compute_cid(raw[limits.CHUNK_SIZE :], RAW)


def test_same_state_same_manifest_cid(store: BlockStore) -> None:
    assert save_checkpoint(store, small_state(), meta()) == save_checkpoint(
        store, small_state(), meta()
    )


def test_dedup_unchanged_layers(store: BlockStore) -> None:
    state = small_state(0)
    save_checkpoint(store, state, meta())
    before = set(store.iter_cids())
    state["block.0.norm.bias"] = state["block.0.norm.bias"] + 1
    save_checkpoint(store, state, meta(round=3))
    new = set(store.iter_cids()) - before
    # the changed one-chunk layer + the new manifest + the UnixFS view's weights file node and
    # directory (its header and config.json blocks are unchanged)
    assert len(new) == 2 + 2


def test_tied_weights_stored_once(store: BlockStore) -> None:
    w = torch.randn(600, 1000)
    before = len(list(store.iter_cids()))
    cid = save_checkpoint(store, {"wte.weight": w, "lm_head.weight": w}, meta())
    m = read_manifest(store, cid)
    assert m.layers[0].chunks == m.layers[1].chunks
    view = len(unixfs_view(store, cid).blocks)  # header, file node, directory
    assert len(list(store.iter_cids())) - before == 3 + 1 + view  # 3 chunks + manifest + view


def test_linked_nodes_when_lists_are_large(store: BlockStore) -> None:
    state = {f"layer.{i}.w": torch.full((300_000,), float(i)) for i in range(12)}
    layout = ManifestLayout(max_inline_chunks=1, max_node_size=700)
    cid = save_checkpoint(store, state, meta(), layout=layout)
    root = decode(store.get(cid))
    assert root["layers"] == [] and len(root["layer_pages"]) > 1
    loaded, manifest = load_checkpoint(store, cid)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert [len(layer.chunks) for layer in manifest.layers] == [2] * 12
    # default layout: same tensors, a single node
    plain = save_checkpoint(store, state, meta())
    assert decode(store.get(plain))["layer_pages"] == []


def test_missing_blocks_is_incremental(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = BlockStore(tmp_path / "src")
    dst = BlockStore(tmp_path / "dst")
    state = {f"layer.{i}.w": torch.full((300_000,), float(i)) for i in range(6)}
    cid = save_checkpoint(
        src, state, meta(), layout=ManifestLayout(max_inline_chunks=1, max_node_size=700)
    )
    rounds = 0
    while wanted := missing_blocks(dst, cid):
        rounds += 1
        assert rounds < 10
        for block in wanted:
            dst.put(block, src.get(block))
    assert rounds == 4  # root, then layer pages, then chunk pages, then chunks
    assert missing_blocks(dst, cid) == []
    assert missing_blocks(BlockStore(tmp_path / "empty"), cid) == [cid]
    loaded, _ = load_checkpoint(dst, cid)
    assert torch.equal(loaded["layer.5.w"], state["layer.5.w"])


def test_aggregation_record_round_trips(store: BlockStore) -> None:
    update = save_checkpoint(store, small_state(1), meta(kind="update"))
    record = AggregationRecord("centered_clip", {"tau": 1.0, "iters": 3}, [update])
    cid = save_checkpoint(store, small_state(), meta(aggregation=record, extra={"note": "x"}))
    m = read_manifest(store, cid)
    assert m.aggregation == record
    assert m.extra == {"note": "x", "unixfs": unixfs_view(store, cid).root}


@pytest.mark.parametrize(
    "name",
    [
        "a/b",
        "..",
        "a..b",
        "../etc/passwd",
        ".hidden",
        "trailing.",
        "back\\slash",
        "sp ace",
        "",
        "x" * 600,
    ],
)
def test_path_like_layer_names_rejected(store: BlockStore, name: str) -> None:
    before = snapshot(store)
    with pytest.raises(CheckpointError, match="layer name"):
        save_checkpoint(store, {"ok.weight": torch.zeros(2), name: torch.zeros(2)}, meta())
    assert snapshot(store) == before


def test_real_model_names_work(store: BlockStore) -> None:
    names = [
        "transformer.h.0.attn.c_attn.weight",
        "transformer.wte.weight",
        "lm_head.weight",
        "bn.num_batches_tracked",
    ]
    cid = save_checkpoint(store, {n: torch.zeros(2) for n in names}, meta())
    assert [layer.name for layer in read_manifest(store, cid).layers] == names


@pytest.mark.parametrize(
    ("state", "meta_changes", "message"),
    [
        ({"w": torch.zeros(2, dtype=torch.complex64)}, {}, "not supported"),
        ({"w": [1, 2]}, {}, "not a tensor"),
        ({"w": torch.zeros(2)}, {"kind": "weights"}, "kind must be"),
        ({"w": torch.zeros(2)}, {"round": -1}, "round must be"),
        (
            {"w": torch.zeros(2)},
            {"model_config": {"x": float("nan")}},
            "model_config must be plain JSON",
        ),
        ({"w": torch.zeros(2)}, {"tokenizer_files": {"../x": b""}}, "bad file name"),
        ({"w": torch.zeros(2)}, {"tokenizer_files": {"config.json": b""}}, "bad file name"),
        ({"w": torch.zeros(*([1] * 9))}, {}, "MAX_DIMS"),
    ],
)
def test_bad_save_inputs(store: BlockStore, state, meta_changes, message) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(store)
    with pytest.raises(CheckpointError, match=message):
        save_checkpoint(store, state, meta(**meta_changes))
    assert snapshot(store) == before


# -- untrusted manifests ----------------------------------------------------------------------


def _root(store: BlockStore, **changes: object) -> dict:  # type: ignore[type-arg]
    cid = save_checkpoint(store, {"a.w": torch.zeros(4), "b.w": torch.ones(2, 2)}, meta())
    root = decode(store.get(cid))
    root.update(changes)
    return root


def _put(store: BlockStore, node: object) -> CID:
    data = encode(node)
    cid = compute_cid(data, DAG_CBOR)
    store.put(cid, data)
    return cid


def _layer(root: dict, index: int, **changes: object) -> list:  # type: ignore[type-arg]
    layers = [dict(x) for x in root["layers"]]
    layers[index].update(changes)
    return layers


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: {**r, "version": 2}, "version 2 not supported"),
        (lambda r: {**r, "type": "other"}, "not a cnode manifest"),
        (lambda r: {**r, "surprise": 1}, "unknown"),
        (lambda r: {k: v for k, v in r.items() if k != "run"}, "missing"),
        (lambda r: {**r, "epoch": True}, "epoch must be an integer"),
        (lambda r: {**r, "layers": _layer(r, 0, shape=[5])}, "is 20 bytes but size says 16"),
        (lambda r: {**r, "layers": _layer(r, 0, dtype="float8")}, "unknown dtype"),
        (lambda r: {**r, "layers": _layer(r, 0, name="../evil")}, "bad layer name"),
        (lambda r: {**r, "layers": _layer(r, 1, name="a.w")}, "duplicate layer name"),
        (lambda r: {**r, "layers": _layer(r, 0, shape=[1] * 9, size=4)}, "MAX_DIMS"),
        (lambda r: {**r, "layers": _layer(r, 0, chunks=[])}, "0 chunks listed"),
        (lambda r: {**r, "layer_count": 3}, "says 3 layers"),
        (lambda r: {**r, "total_bytes": 1}, "says 1 bytes"),
        (lambda r: {**r, "parent": compute_cid(b"x", RAW)}, "dag-cbor CID link"),
        (lambda r: {**r, "layers": _layer(r, 0, size=2**40, shape=[2**38])}, "MAX_LAYER_BYTES"),
    ],
)
def test_bad_manifests_rejected(store: BlockStore, mutate, message) -> None:  # type: ignore[no-untyped-def]
    cid = _put(store, mutate(_root(store)))
    before = snapshot(store)
    with pytest.raises(ManifestError, match=message):
        read_manifest(store, cid)
    with pytest.raises(ManifestError):
        load_checkpoint(store, cid)
    assert snapshot(store) == before


def test_non_canonical_and_truncated_manifest(store: BlockStore) -> None:
    good = encode(_root(store))
    truncated = good[:-3]
    cid = compute_cid(truncated, DAG_CBOR)
    store.put(cid, truncated)
    before = snapshot(store)
    with pytest.raises(ManifestError, match="malformed DAG-CBOR"):
        read_manifest(store, cid)
    assert snapshot(store) == before
    # same map, keys in the wrong order: decodes to the same value but is not canonical
    flipped = bytes.fromhex("a2616201616101")
    cid2 = compute_cid(flipped, DAG_CBOR)
    store.put(cid2, flipped)
    before = snapshot(store)
    with pytest.raises(ManifestError, match="non-canonical"):
        read_manifest(store, cid2)
    assert snapshot(store) == before


def test_missing_chunk_and_missing_manifest(store: BlockStore) -> None:
    cid = save_checkpoint(store, small_state(), meta())
    chunk = read_manifest(store, cid).layers[0].chunks[1]
    store.delete(chunk)
    assert missing_blocks(store, cid) == [chunk]
    before = snapshot(store)
    with pytest.raises(BlockNotFoundError, match=str(chunk)):
        load_checkpoint(store, cid)
    assert snapshot(store) == before
    absent = compute_cid(b"\xa0", DAG_CBOR)
    with pytest.raises(BlockNotFoundError, match=str(absent)):
        read_manifest(store, absent)


def test_chunk_of_wrong_length_is_a_manifest_error_not_corruption(store: BlockStore) -> None:
    root = _root(store)
    other = store.put_new(b"\x00" * 12, RAW)  # a real block, but 12 bytes, not the 16 needed
    cid = _put(store, {**root, "layers": _layer(root, 0, chunks=[other])})
    with pytest.raises(ManifestError, match="12 bytes, the manifest needs 16"):
        load_checkpoint(store, cid)
    assert store.has(other)  # a lying manifest must not get good blocks quarantined


def test_oversize_manifest_block(store: BlockStore) -> None:
    root = _root(store, extra={"pad": "x" * (limits.MAX_BLOCK_SIZE + 10)})
    import dag_cbor

    data = dag_cbor.encode(
        root | {"parent": None, "layers": [], "layer_count": 0, "total_bytes": 0}
    )
    cid = CID(DAG_CBOR, __import__("hashlib").sha256(data).digest())
    blocks = store.root / "blocks" / str(cid)[-3:-1]
    blocks.mkdir(parents=True, exist_ok=True)
    (blocks / str(cid)).write_bytes(data)  # planted directly: put() would refuse it
    with pytest.raises(Exception, match="MAX_BLOCK_SIZE"):
        read_manifest(store, cid)


def test_meta_defaults() -> None:
    m = CheckpointMeta(run_id="r")
    assert (m.kind, m.epoch, m.parent, m.aggregation) == ("checkpoint", 0, None, None)


def test_oversize_manifest_page_list(store: BlockStore) -> None:
    page = compute_cid(b"\xa0", DAG_CBOR)
    too_many = [page] * (limits.MAX_MANIFEST_NODES + 1)
    cid = _put(store, _root(store, layers=[], layer_pages=too_many))
    with pytest.raises(ManifestError, match=f"at most {limits.MAX_MANIFEST_NODES}"):
        read_manifest(store, cid)


def test_layer_list_over_one_block_at_the_default_layout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A layer list > 1 MiB at the default layout goes to linked layer pages, and round-trips.

    2,400 tiny layers with ~390-byte names (MAX_LAYER_NAME_LEN is 512) make ~1.2 MB of layer
    entries. ~10,000 layers with 40-byte names would do the same but take ~25 s here: each link
    costs ~0.2 ms in multiformats' CID constructor (runtime type validation), both ways.
    """
    from cnode.storage import export_car, import_car, verify_checkpoint

    store = BlockStore(tmp_path / "src")
    n = 2_400
    prefix = "model.encoder." + "block.0." * 46
    # 16 distinct chunk contents (deduplicated on disk); every name differs, as in a real model
    state = {f"{prefix}{i:05d}.weight": torch.full((2,), float(i % 16)) for i in range(n)}
    cid = save_checkpoint(store, state, meta())
    root = decode(store.get(cid))
    assert root["layers"] == [] and len(root["layer_pages"]) >= 2 and root["layer_count"] == n
    pages = [store.get(page) for page in root["layer_pages"]]
    assert sum(map(len, pages)) > limits.MAX_BLOCK_SIZE  # really more than one block's worth
    assert all(len(page) <= limits.MAX_BLOCK_SIZE for page in pages)

    loaded, manifest = load_checkpoint(store, cid)
    assert [layer.name for layer in manifest.layers] == list(state)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    report = verify_checkpoint(store, cid)
    assert report.ok and report.layers == n, report.faults[:3]

    car = tmp_path / "big.car"
    assert export_car(store, cid, car) == 1 + len(pages) + 16 + len(unixfs_view(store, cid).blocks)
    dst = BlockStore(tmp_path / "dst")
    assert import_car(dst, car) == cid
    assert verify_checkpoint(dst, cid).ok  # every block arrived and hashes to its CID


def test_every_walk_of_the_tree_bounds_its_nodes(
    store: BlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resolve, the closure (fetch, gc, export) and verify walk one way, under one bound."""
    from cnode.storage import ManifestLayout, manifest_closure, verify_checkpoint

    state = {"w": torch.arange(5 << 18, dtype=torch.float32)}  # 5 MiB: five chunk pages
    cid = save_checkpoint(store, state, meta(), layout=ManifestLayout(max_inline_chunks=1))
    assert len(manifest_closure(store, cid)) == 1 + 5 + 5 + 3  # + the UnixFS view's 3 blocks
    monkeypatch.setattr(limits, "MAX_MANIFEST_NODES", 5)
    with pytest.raises(ManifestError, match="MAX_MANIFEST_NODES 5"):
        read_manifest(store, cid)
    with pytest.raises(ManifestError, match="MAX_MANIFEST_NODES 5"):
        manifest_closure(store, cid)
    report = verify_checkpoint(store, cid)
    assert [f.kind for f in report.faults] == ["manifest-invalid"]
    assert "MAX_MANIFEST_NODES 5" in report.faults[0].message


def test_write_stream_cuts_chunks_and_names_a_short_file(store: BlockStore) -> None:
    import io

    from cnode.storage import limits
    from cnode.storage._checkpoint import write_stream
    from cnode.storage._manifest import chunk_count

    data = bytes(range(256)) * (limits.CHUNK_SIZE // 256) + b"tail"
    cids = write_stream(store, io.BytesIO(data), len(data), "w")
    assert len(cids) == chunk_count(len(data)) == 2
    assert b"".join(store.get(c) for c in cids) == data
    with pytest.raises(CheckpointError, match="w: file ends 4 bytes early"):
        write_stream(store, io.BytesIO(data[:-4]), len(data), "w")
