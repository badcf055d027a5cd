"""What a manifest needs, as far as is known from what is held: closure, missing blocks, gc.

Built on :func:`~._walk.walk_manifest` (the one bounded walk) and the UnixFS view a checkpoint
records (``_unixfs``). The block store's gc imports :func:`reachable_blocks` from here; nothing
here imports the store.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping

from ._cid import CID
from ._exceptions import BlockNotFoundError, CorruptBlockError, ManifestError
from ._manifest import (
    PartialLayer,
    RootNode,
    parse_chunk_page,
    parse_layer_page,
    parse_root,
)
from ._unixfs import build_view, recorded_root
from ._walk import (
    BlockReader,
    ManifestWalk,
    WalkBounds,
    WalkedLayer,
    assemble,
    resolve,
    walk_manifest,
)
from .limits import CHUNK_SIZE

__all__ = [
    "ClosureWalk",
    "manifest_closure",
    "missing_blocks",
    "reachable_blocks",
    "view_closure",
]


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


# What a CID is to a ClosureWalk: the root, a layer page, a chunk page, or a leaf (a chunk, a
# side-file chunk, a UnixFS view block: nothing below it to read).
_ROOT, _LAYER_PAGE, _CHUNK_PAGE, _LEAF = "root", "layer page", "chunk page", "leaf"


class ClosureWalk:
    """A manifest's missing blocks, learned in one pass while they are fetched.

    ``missing_blocks`` reads every held node each time it is called, so a fetcher that loops
    fetch/missing_blocks reads and parses the root, pages and chunk lists again on every round
    (specs/blocks.md#fetching). A ClosureWalk reads each node once: :meth:`start` reads the held
    ones (a resumed fetch), :meth:`arrived` parses a fetched node from the bytes just received,
    and each returns only the blocks that node newly reveals as missing. It enforces the bounds
    ``walk_manifest`` does, through the same ``WalkBounds``, and ends, once every page is known,
    with the UnixFS view the manifest records (as :func:`manifest_closure`).

    With ``layers``, only part of the manifest is wanted (a partition's segments of an update,
    specs/training.md#partitioned-rounds): every node is still listed (root, layer pages, every
    layer's chunk pages: what reading the manifest needs), but only the chunks of the named
    layers, and no side-file chunks nor UnixFS view.

    Safe to call from several threads (one lock): the block exchange stores and reveals in
    worker threads. Error handling: ManifestError for a node that breaks the schema or a tree
    over the bounds; a held node that is corrupt is quarantined by the store and fetched again.
    """

    def __init__(
        self, store: BlockReader, root: CID, layers: Collection[str] | None = None
    ) -> None:
        self.store = store
        self.root = root
        self._layers = None if layers is None else frozenset(layers)
        self._wanted_pages: set[CID] = set()  # chunk pages of wanted layers (with ``layers``)
        self._kinds: dict[CID, str] = {root: _ROOT}
        self._root: RootNode | None = None
        self._layer_pages: dict[CID, tuple[PartialLayer, ...]] = {}
        self._chunk_pages: dict[CID, tuple[CID, ...]] = {}
        self._unread = 1  # nodes listed but not parsed yet (the root)
        self._bounds = WalkBounds()
        self._parsed: set[CID] = set()
        self._view_done = False
        self._sizes: dict[CID, int] = {}  # a leaf's length, where the node listing it tells
        self._lock = threading.Lock()

    @property
    def nodes_read(self) -> int:
        """Nodes parsed so far (each at most once)."""
        return len(self._parsed)

    def expected_size(self, cid: CID) -> int | None:
        """The length a leaf must have, as the node that listed it says (a chunk of an inline
        layer or of a side file: ``CHUNK_SIZE`` slices of its size; a block of the UnixFS
        view, rebuilt here); None when unknown (a node, a chunk listed on a chunk page). A hint
        for the fetch's batching (specs/blocks.md#fetching): a block's bytes are checked
        against its CID, not this."""
        return self._sizes.get(cid)  # one dict read: atomic, no lock needed

    def start(self) -> tuple[list[CID], list[CID]]:
        """What is missing as far as the held nodes tell: (nodes, leaves) in fetch order."""
        with self._lock:
            return self._expand([self.root])

    def arrived(self, cid: CID, data: bytes) -> tuple[list[CID], list[CID]]:
        """``cid`` was fetched (verified) with ``data``: what it newly reveals as missing.

        A leaf reveals nothing; a root or page is parsed from ``data`` (not read back).
        """
        with self._lock:
            if self._kinds.get(cid, _LEAF) == _LEAF:
                return [], []
            return self._expand(self._learn(cid, data))

    def _held_node(self, cid: CID) -> bytes | None:
        if not self.store.has(cid):
            return None
        try:
            return self.store.get(cid)
        except (BlockNotFoundError, CorruptBlockError):
            return None  # quarantined by the store: fetch it again

    def _expand(self, cids: list[CID]) -> tuple[list[CID], list[CID]]:
        # Breadth first: held nodes are read and parsed now, missing ones returned.
        nodes: list[CID] = []
        leaves: list[CID] = []
        todo = list(cids)
        while todo:
            below: list[CID] = []
            for cid in todo:
                if self._kinds[cid] == _LEAF:
                    if not self.store.has(cid):
                        leaves.append(cid)
                    continue
                data = self._held_node(cid)
                if data is None:
                    nodes.append(cid)
                else:
                    below.extend(self._learn(cid, data))
            todo = below
        leaves.extend(c for c in self._view() if not self.store.has(c))
        return nodes, leaves

    def _list(self, cids: tuple[CID, ...], kind: str) -> list[CID]:
        """Children of a parsed node; pages count towards MAX_MANIFEST_NODES. New ones only."""
        new: list[CID] = []
        for cid in cids:
            if kind != _LEAF:
                self._bounds.page()
            if cid not in self._kinds:
                self._kinds[cid] = kind
                self._unread += kind != _LEAF
                new.append(cid)
        return new

    def _partials(self, partials: tuple[PartialLayer, ...]) -> list[CID]:
        self._bounds.add_layers(len(partials))
        out: list[CID] = []
        for p in partials:
            out += self._list(p.chunk_pages, _CHUNK_PAGE)
            if self._layers is not None and p.name not in self._layers:
                continue
            out += self._list(p.chunks, _LEAF)
            self._sized(p.chunks, p.nbytes)
            if self._layers is not None:
                self._wanted_pages.update(p.chunk_pages)
                for page in p.chunk_pages:  # a page parsed already (listed by another layer)
                    if page in self._chunk_pages:
                        out += self._list(self._chunk_pages[page], _LEAF)
        return out

    def _sized(self, chunks: tuple[CID, ...], nbytes: int) -> None:
        """Record the lengths of ``chunks``, the CHUNK_SIZE slices of ``nbytes`` bytes."""
        for i, cid in enumerate(chunks):
            self._sizes.setdefault(cid, max(0, min(CHUNK_SIZE, nbytes - i * CHUNK_SIZE)))

    def _learn(self, cid: CID, data: bytes) -> list[CID]:
        """Parse one node (once) and list what it links to that was not known yet."""
        kind = self._kinds[cid]
        if cid in self._parsed:
            return []
        self._parsed.add(cid)
        self._unread -= 1
        if kind == _ROOT:
            root = self._root = parse_root(data)
            out = self._list(root.layer_pages, _LAYER_PAGE) + self._partials(root.layers)
            for ref in root.meta.tokenizer_files.values() if self._layers is None else ():
                out += self._list(ref.chunks, _LEAF)
                self._sized(ref.chunks, ref.size)
            return out
        if kind == _LAYER_PAGE:
            partials = self._layer_pages[cid] = parse_layer_page(data)
            return self._partials(partials)
        chunks = self._chunk_pages[cid] = parse_chunk_page(data)
        if self._layers is not None and cid not in self._wanted_pages:
            return []
        return self._list(chunks, _LEAF)

    def _view(self) -> list[CID]:
        """The UnixFS view's blocks, once, when every page is parsed (as view_closure)."""
        if self._view_done or self._unread or self._root is None or self._layers is not None:
            return []
        self._view_done = True
        recorded = recorded_root(self._root.meta.extra)
        if recorded is None:
            return []
        walk = ManifestWalk(self._root, layer_pages=list(self._root.layer_pages))
        partials = list(self._root.layers)
        for page in self._root.layer_pages:
            partials.extend(self._layer_pages[page])
        for p in partials:
            pages: list[tuple[CID, tuple[CID, ...] | None]] = [
                (page, self._chunk_pages[page]) for page in p.chunk_pages
            ]
            walk.layers.append(WalkedLayer(p, pages))
        try:
            manifest = assemble(walk)
        except ManifestError:
            return []  # as view_closure: verify reports it
        view = build_view(manifest.layers, manifest.model_config, manifest.tokenizer_files)
        if view.root != recorded:
            return self._list((recorded,), _LEAF)
        for cid, data in view.blocks:  # rebuilt here: their lengths are known exactly
            self._sizes.setdefault(cid, len(data))
        return self._list(tuple(view.cids()), _LEAF)
