"""The one walk over a manifest's tree of nodes (closure, missing and gc build on it: _closure).

See specs/manifest.md#manifest. A manifest is a root node whose layers may continue in layer
pages, each layer's chunks in chunk pages. :func:`walk_manifest` reads every page the root
reaches, in fetch order, bounded by MAX_MANIFEST_NODES and MAX_LAYERS; ``resolve`` (strict),
``manifest_closure`` (what is known from what is held) and ``verify_checkpoint`` (every fault
reported) all walk with it, so the bounds are enforced in one place.

Only the manifest schema (``_manifest``) is needed here, not the block store, so the store, the
UnixFS view and the closure may all import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from . import limits
from ._cid import CID
from ._exceptions import ManifestError
from ._manifest import (
    Layer,
    Manifest,
    PartialLayer,
    RootNode,
    chunk_count,
    parse_chunk_page,
    parse_layer_page,
    parse_root,
)


class BlockReader(Protocol):
    """What reading a manifest needs: a BlockStore, or a view over staged CAR blocks."""

    def has(self, cid: CID) -> bool: ...

    def get(self, cid: CID) -> bytes: ...


# read(cid, what) -> the node's bytes, or None when it cannot be had (the reader says why);
# ``what`` is "page". A strict reader raises instead.
NodeRead = Callable[[CID, str], bytes | None]
# on_bad_page(page cid, "layer" | "chunk", layer name or None, error): a page that breaks the
# schema. Without one, the walk raises the ManifestError.
OnBadPage = Callable[[CID, str, str | None, ManifestError], None]


@dataclass
class WalkedLayer:
    """One layer as walked: its node, and each chunk page with its chunks (None: not read)."""

    layer: PartialLayer
    pages: list[tuple[CID, tuple[CID, ...] | None]] = field(default_factory=list)

    @property
    def chunks(self) -> list[CID]:
        """Inline chunks, then those of every chunk page that was read."""
        out = list(self.layer.chunks)
        for _page, chunks in self.pages:
            out.extend(chunks or ())
        return out


@dataclass
class ManifestWalk:
    """Everything reached from one root node."""

    root: RootNode
    layer_pages: list[CID] = field(default_factory=list)
    layer_pages_ok: bool = True  # every layer page was read and parsed
    layers: list[WalkedLayer] = field(default_factory=list)


class WalkBounds:
    """The bounds of every walk of one manifest's tree, counted in one place: at most
    MAX_MANIFEST_NODES nodes (the root and its pages) and MAX_LAYERS layers. ``walk_manifest``
    and ``ClosureWalk`` (_closure.py) both count through one of these."""

    def __init__(self) -> None:
        self.nodes = 1  # the root
        self.layers = 0

    def page(self) -> None:
        """One more layer or chunk page; ManifestError past MAX_MANIFEST_NODES."""
        self.nodes += 1
        if self.nodes > limits.MAX_MANIFEST_NODES:
            raise ManifestError(
                f"manifest spans more than MAX_MANIFEST_NODES {limits.MAX_MANIFEST_NODES} nodes"
            )

    def add_layers(self, count: int) -> None:
        """``count`` more layers listed; ManifestError past MAX_LAYERS."""
        self.layers += count
        if self.layers > limits.MAX_LAYERS:
            raise ManifestError(f"more than MAX_LAYERS {limits.MAX_LAYERS} layers")


def walk_manifest(
    root: RootNode,
    read: NodeRead,
    *,
    errors: list[str] | None = None,
    on_bad_page: OnBadPage | None = None,
) -> ManifestWalk:
    """Read every page below ``root`` through ``read``: layer pages first, then chunk pages.

    Raises ManifestError when the tree spans more than MAX_MANIFEST_NODES nodes or lists more
    than MAX_LAYERS layers, and (without ``on_bad_page``) when a page breaks the schema.
    ``errors`` collects bad layer entries instead of raising, as ``parse_layer_page`` does.
    """
    walk = ManifestWalk(root)
    bounds = WalkBounds()
    partials = list(root.layers)
    bounds.add_layers(len(partials))
    for page in root.layer_pages:
        bounds.page()
        walk.layer_pages.append(page)
        data = read(page, "page")
        if data is None:
            walk.layer_pages_ok = False
            continue
        try:
            found = parse_layer_page(data, errors)
        except ManifestError as exc:
            if on_bad_page is None:
                raise
            walk.layer_pages_ok = False
            on_bad_page(page, "layer", None, exc)
            continue
        bounds.add_layers(len(found))
        partials.extend(found)
    for p in partials:
        walked = WalkedLayer(p)
        for page in p.chunk_pages:
            bounds.page()
            data = read(page, "page")
            chunks: tuple[CID, ...] | None = None
            if data is not None:
                try:
                    chunks = parse_chunk_page(data)
                except ManifestError as exc:
                    if on_bad_page is None:
                        raise
                    on_bad_page(page, "chunk", p.name, exc)
            walked.pages.append((page, chunks))
        walk.layers.append(walked)
    return walk


def resolve(root_cid: CID, get: Callable[[CID], bytes]) -> Manifest:
    """Decode the manifest at ``root_cid`` and every linked node, fetched through ``get``.

    Strict: raises ManifestError for anything against the schema or the limits, and whatever
    ``get`` raises for a node it cannot give.
    """
    return assemble(walk_manifest(parse_root(get(root_cid)), lambda cid, _what: get(cid)))


def assemble(walk: ManifestWalk) -> Manifest:
    """The manifest a complete walk describes (every page read); ManifestError if the layers,
    their chunks or the totals do not add up."""
    root = walk.root
    layers = []
    seen: set[str] = set()
    for walked in walk.layers:
        p = walked.layer
        if p.name in seen:
            raise ManifestError(f"duplicate layer name {p.name!r}")
        seen.add(p.name)
        chunks = walked.chunks
        if len(chunks) != chunk_count(p.nbytes):
            raise ManifestError(
                f"layer {p.name!r}: {len(chunks)} chunks listed, {chunk_count(p.nbytes)} needed"
            )
        layers.append(Layer(p.name, p.dtype, p.shape, p.nbytes, tuple(chunks)))
    if len(layers) != root.layer_count:
        raise ManifestError(f"manifest says {root.layer_count} layers but lists {len(layers)}")
    total = sum(layer.nbytes for layer in layers)
    if total != root.total_bytes:
        raise ManifestError(f"manifest says {root.total_bytes} bytes but layers sum to {total}")
    return Manifest(**{**root.meta.__dict__, "layers": tuple(layers)})
