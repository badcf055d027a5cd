from __future__ import annotations

import hashlib

import torch

from cnode.storage import (
    CID,
    DAG_CBOR,
    AggregationRecord,
    BlockStore,
    ManifestLayout,
    compute_cid,
    read_manifest,
    save_checkpoint,
    verify_checkpoint,
)
from cnode.storage._cbor import decode, encode

from .conftest import meta, small_state


def _path(store: BlockStore, cid: object) -> object:
    text = str(cid)
    return store.root / "blocks" / text[-3:-1] / text


def test_good_checkpoint_verifies(store: BlockStore) -> None:
    cid = save_checkpoint(store, small_state(), meta(tokenizer_files={"vocab.json": b"{}"}))
    totals: list[int] = []
    done: list[int] = []
    report = verify_checkpoint(store, cid, on_total=totals.append, on_progress=done.append)
    assert report.ok, report.faults
    assert report.layers == 5
    assert totals == [sum(done)] and report.bytes_checked == sum(done)
    assert report.to_dict()["ok"] is True


def test_every_fault_is_named(store: BlockStore) -> None:
    cid = save_checkpoint(store, small_state(), meta())
    m = read_manifest(store, cid)
    embed, bias = m.layer("embed.weight"), m.layer("block.0.norm.bias")
    store.delete(embed.chunks[0])
    _path(store, embed.chunks[1]).write_bytes(b"rotten")  # type: ignore[attr-defined]
    _path(store, bias.chunks[0]).write_bytes(b"\x00" * bias.nbytes)  # type: ignore[attr-defined]
    report = verify_checkpoint(store, cid)
    assert not report.ok
    found = {(f.kind, f.cid) for f in report.faults}
    assert found == {
        ("block-missing", str(embed.chunks[0])),
        ("block-corrupt", str(embed.chunks[1])),
        ("block-corrupt", str(bias.chunks[0])),
    }
    assert all(f.layer for f in report.faults)
    assert not store.has(bias.chunks[0])  # quarantined


def test_bad_layers_each_reported(store: BlockStore) -> None:
    cid = save_checkpoint(store, small_state(), meta())
    root = decode(store.get(cid))
    root["layers"][1]["shape"] = [17]
    root["layers"][3]["name"] = "a/../b"
    data = encode(root)
    bad = compute_cid(data, DAG_CBOR)
    store.put(bad, data)
    report = verify_checkpoint(store, bad)
    messages = [f.message for f in report.faults if f.kind == "layer-invalid"]
    assert len(messages) == 2
    assert any("block.0.norm.bias" in m and "34 bytes" in m for m in messages)
    assert any("bad layer name" in m for m in messages)


def test_missing_and_undecodable_manifest(store: BlockStore) -> None:
    absent = compute_cid(b"\xa0", DAG_CBOR)
    report = verify_checkpoint(store, absent)
    assert [f.kind for f in report.faults] == ["manifest-missing"]
    junk = store.put_new(encode({"type": "nope"}), DAG_CBOR)
    assert [f.kind for f in verify_checkpoint(store, junk).faults] == ["manifest-invalid"]


def test_missing_page_reported(store: BlockStore) -> None:
    state = {f"l.{i}": torch.full((1000,), float(i)) for i in range(8)}
    cid = save_checkpoint(store, state, meta(), layout=ManifestLayout(max_node_size=600))
    page = decode(store.get(cid))["layer_pages"][0]
    store.delete(page)
    report = verify_checkpoint(store, cid)
    assert ("page-missing", str(page)) in {(f.kind, f.cid) for f in report.faults}


def test_updates_checked_where_held(store: BlockStore) -> None:
    # A signed update is any strict DAG-CBOR block here (cnode's training names signed update
    # header envelopes; the CLI checks their signatures). Unsorted keys are not strict DAG-CBOR.
    held = store.put_new(encode({"payload": b"x", "sig": b"y", "signer": "z"}), DAG_CBOR)
    not_cbor = CID(DAG_CBOR, hashlib.sha256(b"\xa2\x61\x62\x01\x61\x61\x01").digest())
    store.put(not_cbor, b"\xa2\x61\x62\x01\x61\x61\x01")
    absent = compute_cid(b"\xa1", DAG_CBOR)
    record = AggregationRecord("mean", {}, [held, not_cbor, absent])
    cid = save_checkpoint(store, small_state(), meta(aggregation=record))
    report = verify_checkpoint(store, cid)
    assert [(f.kind, f.cid) for f in report.faults] == [("update-invalid", str(not_cbor))]
    assert any("1 of 3 signed updates are not held" in n for n in report.notes)
    _path(store, held).write_bytes(b"\xa0")  # type: ignore[attr-defined]
    kinds = [f.kind for f in verify_checkpoint(store, cid).faults]
    assert "update-corrupt" in kinds
