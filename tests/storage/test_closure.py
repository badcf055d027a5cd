"""storage/_closure.py: ClosureWalk learns a manifest's missing blocks in one pass."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
import torch

from cnode.storage import (
    CID,
    RAW,
    BlockStore,
    ClosureWalk,
    ManifestError,
    ManifestLayout,
    limits,
    manifest_closure,
    missing_blocks,
    save_checkpoint,
    verify_received,
)

from .conftest import meta

PAGED = ManifestLayout(max_inline_chunks=1, max_node_size=700)


class CountingStore(BlockStore):
    """A real store that counts the blocks read out of it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[CID] = []

    def get(self, cid: CID) -> bytes:
        self.reads.append(cid)
        return super().get(cid)


def _paged(tmp_path: Path) -> tuple[BlockStore, CID]:
    src = BlockStore(tmp_path / "src")
    state = {f"layer.{i}.w": torch.full((300_000,), float(i)) for i in range(6)}
    files = {"tokenizer.json": b'{"v": 1}'}
    cid = save_checkpoint(src, state, meta(tokenizer_files=files), layout=PAGED)
    return src, cid


def _fetch(src: BlockStore, dst: BlockStore, walk: ClosureWalk) -> list[CID]:
    """What a fetch does: take the next missing CID, store it verified, enqueue what it shows."""
    nodes, leaves = walk.start()
    queue = deque([*nodes, *leaves])
    fetched: list[CID] = []
    for _ in range(10_000):
        if not queue:
            return fetched
        cid = queue.popleft()
        block = verify_received(cid, src.get(cid))
        dst.put_verified(block)
        fetched.append(cid)
        nodes, leaves = walk.arrived(block.cid, block.data)
        queue.extendleft(reversed(nodes))
        queue.extend(leaves)
    raise AssertionError("the walk did not end")


def test_one_pass_fetches_the_closure_and_reads_nothing_back(tmp_path: Path) -> None:
    src, root = _paged(tmp_path)
    dst = CountingStore(tmp_path / "dst")
    walk = ClosureWalk(dst, root)
    fetched = _fetch(src, dst, walk)
    closure = manifest_closure(src, root)
    assert sorted(map(str, fetched)) == sorted(map(str, closure))
    assert len(fetched) == len(set(fetched))  # nothing asked for twice
    assert dst.reads == []  # every node was parsed from the bytes that arrived
    # root, layer pages and chunk pages: each parsed once
    nodes = [c for c in closure if c.codec == root.codec]
    assert walk.nodes_read == len(nodes) > 3
    assert missing_blocks(dst, root) == []


def test_a_resumed_walk_reads_each_held_node_once(tmp_path: Path) -> None:
    src, root = _paged(tmp_path)
    dst = CountingStore(tmp_path / "dst")
    closure = manifest_closure(src, root)
    for cid in closure[: len(closure) // 2]:  # root and pages first: an interrupted fetch
        dst.put(cid, src.get(cid))
    dst.reads.clear()
    walk = ClosureWalk(dst, root)
    nodes, leaves = walk.start()
    held_nodes = [c for c in closure[: len(closure) // 2] if c.codec == root.codec]
    assert sorted(map(str, dst.reads)) == sorted(map(str, held_nodes))
    assert set(nodes) | set(leaves) <= set(closure)
    fetched = _fetch(src, dst, ClosureWalk(dst, root))
    rest = closure[len(closure) // 2 :]
    assert sorted(map(str, fetched)) == sorted(map(str, rest))
    assert missing_blocks(dst, root) == []


def test_a_whole_store_needs_nothing(tmp_path: Path) -> None:
    src, root = _paged(tmp_path)
    assert ClosureWalk(src, root).start() == ([], [])
    assert ClosureWalk(BlockStore(tmp_path / "empty"), root).start() == ([root], [])


def test_bounds_hold_as_in_walk_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, root = _paged(tmp_path)
    monkeypatch.setattr(limits, "MAX_MANIFEST_NODES", 3)
    with pytest.raises(ManifestError, match="MAX_MANIFEST_NODES"):
        _fetch(src, BlockStore(tmp_path / "dst"), ClosureWalk(BlockStore(tmp_path / "dst"), root))


def test_a_page_that_breaks_the_schema_is_an_error(tmp_path: Path) -> None:
    src, root = _paged(tmp_path)
    walk = ClosureWalk(BlockStore(tmp_path / "dst"), root)
    walk.arrived(root, src.get(root))
    page = next(c for c in manifest_closure(src, root)[1:] if c.codec == root.codec)
    with pytest.raises(ManifestError):
        walk.arrived(page, b"\xa0")  # an empty map: no page


def test_a_walk_for_some_layers_lists_every_node_but_only_their_chunks(tmp_path: Path) -> None:
    """``layers``: a partition's fetch. Every manifest node (the manifest must read whole), the
    named layers' chunks (some behind chunk pages), no other chunk, no side file, no view."""
    from cnode.storage import DAG_CBOR, read_manifest

    src, root = _paged(tmp_path)
    manifest = read_manifest(src, root)
    wanted = {"layer.1.w", "layer.4.w"}
    dst = CountingStore(tmp_path / "dst")
    walk = ClosureWalk(dst, root, layers=wanted)
    fetched = _fetch(src, dst, walk)
    nodes = [c for c in manifest_closure(src, root) if c.codec == DAG_CBOR]
    chunks = [c for layer in manifest.layers if layer.name in wanted for c in layer.chunks]
    assert sorted(map(str, fetched)) == sorted(map(str, [*nodes, *chunks]))
    assert len(chunks) == 4 and dst.reads == []  # two chunks each; nothing read back
    assert walk.nodes_read == len(nodes) > 3  # each node parsed once
    assert read_manifest(dst, root) == manifest  # every node is held: the manifest reads
    # Resumed with every node held: only the chunks still missing, each node read once.
    dst.delete(chunks[0])
    dst.reads.clear()
    again = ClosureWalk(dst, root, layers=wanted)
    assert again.start() == ([], [chunks[0]])
    assert sorted(map(str, dst.reads)) == sorted(map(str, nodes))


def test_a_walk_knows_the_length_of_each_chunk_its_nodes_list(tmp_path: Path) -> None:
    """expected_size: the CHUNK_SIZE slices of an inline layer (the last one short) and of a
    side file, as the node listing them says, and the view's blocks, rebuilt from the
    manifest; None for nodes and for chunks on chunk pages (what a fetch's requests are sized
    by, specs/blocks.md#fetching)."""
    src = BlockStore(tmp_path / "src")
    state = {
        "big.w": torch.zeros(300_000),  # 1.2 MB: a full chunk and a short one
        "small.b": torch.ones(7),  # 28 bytes
    }
    files = {"tokenizer.json": b'{"v": 2}'}
    root = save_checkpoint(src, state, meta(tokenizer_files=files))
    walk = ClosureWalk(BlockStore(tmp_path / "dst"), root)
    assert walk.start() == ([root], [])
    assert walk.expected_size(root) is None  # a node: its length is not listed anywhere
    _, leaves = walk.arrived(root, src.get(root))
    sizes = {walk.expected_size(c) for c in leaves}
    chunks = {limits.CHUNK_SIZE, 1_200_000 - limits.CHUNK_SIZE, 28, 8}  # the side file's: 8 B
    assert len(leaves) > len(chunks) and chunks <= sizes  # and the UnixFS view's blocks
    assert all(walk.expected_size(c) == len(src.get(c)) for c in leaves)


def test_chunks_listed_on_chunk_pages_have_no_expected_size(tmp_path: Path) -> None:
    src, root = _paged(tmp_path)
    walk = ClosureWalk(BlockStore(tmp_path / "dst"), root)
    fetched = _fetch(src, BlockStore(tmp_path / "dst"), walk)
    paged = [c for c in fetched if c.codec == RAW and walk.expected_size(c) is None]
    assert paged  # every chunk of the paged layers
    assert all(walk.expected_size(c) in (None, len(src.get(c))) for c in fetched)
