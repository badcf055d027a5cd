"""What a manifest needs, as far as is known from what is held: closure, missing blocks, gc.

Built on :func:`~._walk.walk_manifest` (the one bounded walk) and the UnixFS view a checkpoint
records (``_unixfs``). The block store's gc imports :func:`reachable_blocks` from here; nothing
here imports the store.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._cid import CID
from ._exceptions import BlockNotFoundError, CorruptBlockError, ManifestError
from ._manifest import parse_root
from ._unixfs import build_view, recorded_root
from ._walk import BlockReader, resolve, walk_manifest

__all__ = ["manifest_closure", "missing_blocks", "reachable_blocks", "view_closure"]


def _held_node(store: BlockReader, cid: CID) -> bytes | None:
    try:
        return store.get(cid)
    except (BlockNotFoundError, CorruptBlockError):
        return None


def manifest_closure(store: BlockReader, manifest_cid: CID) -> list[CID]:
    """Every block the manifest needs that can be known from what is held, in fetch order.

    Root, layer pages, each layer's chunk pages and chunks, side-file chunks, then the blocks of
    the UnixFS view it records (once every page is held). Pages not held end the walk below
    them. Raises ManifestError if a held node breaks the schema or the
    tree breaks MAX_MANIFEST_NODES.
    """
    out: dict[CID, None] = {manifest_cid: None}
    data = _held_node(store, manifest_cid)
    if data is None:
        return list(out)
    walk = walk_manifest(parse_root(data), lambda cid, _what: _held_node(store, cid))
    out.update(dict.fromkeys(walk.layer_pages))
    for walked in walk.layers:
        for page, chunks in walked.pages:
            out[page] = None
            out.update(dict.fromkeys(chunks or ()))
        out.update(dict.fromkeys(walked.layer.chunks))
    for ref in walk.root.meta.tokenizer_files.values():
        out.update(dict.fromkeys(ref.chunks))
    out.update(dict.fromkeys(view_closure(store, manifest_cid, walk.root.meta.extra)))
    return list(out)


def missing_blocks(store: BlockReader, manifest_cid: CID) -> list[CID]:
    """Blocks the manifest needs that are not held, as far as is known from what is held.

    Incremental: an absent root gives ``[root]``; absent pages are listed, not their content.
    A fetcher loops fetch/missing_blocks until the list is empty.
    """
    return [cid for cid in manifest_closure(store, manifest_cid) if not store.has(cid)]


def reachable_blocks(store: BlockReader, manifest_cid: CID) -> set[CID]:
    """Held blocks gc must keep for this root (a root that is not a manifest keeps itself)."""
    try:
        closure = manifest_closure(store, manifest_cid)
    except ManifestError:
        closure = [manifest_cid]
    return {cid for cid in closure if store.has(cid)}


def view_closure(store: BlockReader, manifest_cid: CID, extra: Mapping[str, object]) -> list[CID]:
    """The blocks of the UnixFS view the manifest records, once its pages are all held.

    The view is rebuilt from the manifest; a recorded directory that differs from the rebuilt
    one is listed alone (verify reports it). Nothing for a manifest that records no view.
    """
    recorded = recorded_root(extra)
    if recorded is None:
        return []
    try:
        manifest = resolve(manifest_cid, store.get)
    except (BlockNotFoundError, CorruptBlockError, ManifestError):
        return []  # pages still missing: known once they are held
    view = build_view(manifest.layers, manifest.model_config, manifest.tokenizer_files)
    return view.cids() if view.root == recorded else [recorded]
