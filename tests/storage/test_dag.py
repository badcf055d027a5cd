"""storage/_dag.py: the links a gateway's DAG walk follows; CAR v1 framing (specs/gateway.md)."""

from __future__ import annotations

import pytest

from cnode.storage import (
    DAG_CBOR,
    DAG_PB,
    AggregationRecord,
    BlockStore,
    CARError,
    block_links,
    car_header,
    car_section,
    compute_cid,
    is_unixfs_file,
    manifest_closure,
    read_car,
    read_manifest,
    save_checkpoint,
    unixfs_view,
)

from .conftest import meta, small_state


def test_a_manifest_links_its_checkpoint_not_its_parent_or_updates(store: BlockStore) -> None:
    parent = save_checkpoint(store, small_state(1), meta())
    update = save_checkpoint(store, small_state(2), meta(kind="update"))
    record = AggregationRecord("mean", {}, [update])
    root = save_checkpoint(store, small_state(3), meta(parent=parent, aggregation=record))
    links = block_links(root, store.get(root))
    assert parent not in links and update not in links
    view = unixfs_view(store, root)
    assert links[-1] == view.root  # the UnixFS view, after chunks and side files
    # Walking every link from the root reaches exactly the checkpoint's closure.
    seen, stack = set(), [root]
    while stack:
        cid = stack.pop()
        if cid not in seen:
            seen.add(cid)
            stack.extend(block_links(cid, store.get(cid)))
    assert seen == set(manifest_closure(store, root))


def test_entity_scope_tells_files_from_the_rest(store: BlockStore) -> None:
    root = save_checkpoint(store, small_state(), meta())
    view = unixfs_view(store, root)
    weights = view.files["model.safetensors"]
    assert weights.codec == DAG_PB and is_unixfs_file(weights, store.get(weights))
    assert not is_unixfs_file(view.root, store.get(view.root))  # a directory
    assert not is_unixfs_file(root, store.get(root))
    chunk = read_manifest(store, root).layers[0].chunks[0]
    assert block_links(chunk, store.get(chunk)) == []


def test_read_car_round_trip_and_errors() -> None:
    a, b = compute_cid(b"a"), compute_cid(b"\xa0", DAG_CBOR)
    body = car_header([a]) + car_section(a, b"a") + car_section(b, b"\xa0")
    assert read_car(body, 2) == ([a], [(a, b"a"), (b, b"\xa0")])
    with pytest.raises(CARError, match="more than the 1 blocks"):
        read_car(body, 1)
    with pytest.raises(CARError, match="truncated CAR"):
        read_car(body[:-1], 2)
    with pytest.raises(CARError, match="header"):
        read_car(b"\x05hello", 2)
    with pytest.raises(CARError, match="truncated"):
        read_car(b"", 2)
