"""Encoding of the manifest: the one write path, and when to split into linked nodes.

See specs/manifest.md#interaction (step 2). Decoding lives in ``_manifest.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _cbor, limits
from ._cid import CID, DAG_CBOR, compute_cid
from ._exceptions import BlockTooLargeError, CheckpointError, StorageError
from ._manifest import (
    CHUNK_PAGE_TYPE,
    LAYER_PAGE_TYPE,
    ROOT_TYPE,
    CheckpointMeta,
    FileRef,
    Layer,
)

# -- encoding -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestLayout:
    """When to split: chunk lists longer than ``max_inline_chunks`` go to chunk pages, and the
    layer list goes to layer pages when the root would exceed ``max_node_size``."""

    max_inline_chunks: int = limits.MAX_CHUNKS_PER_NODE
    max_node_size: int = limits.MAX_BLOCK_SIZE


DEFAULT_LAYOUT = ManifestLayout()


def _enc(value: Any, what: str) -> bytes:
    try:
        return _cbor.encode(value)
    except StorageError as exc:
        raise CheckpointError(f"{what}: {exc}") from exc


def _layer_node(layer: Layer, pages: Sequence[CID]) -> dict[str, Any]:
    return {
        "name": layer.name,
        "dtype": layer.dtype,
        "shape": list(layer.shape),
        "size": layer.nbytes,
        "chunks": [] if pages else list(layer.chunks),
        "chunk_pages": list(pages),
    }


def _json_normal(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """model_config as its config.json would hold it: str keys, lists, no NaN/Infinity."""
    if config is None:
        return None
    try:
        normal = json.loads(json.dumps(config, allow_nan=False, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"model_config must be plain JSON (no NaN/Infinity): {exc}") from exc
    if not isinstance(normal, dict):
        raise CheckpointError("model_config must be a JSON object")
    return normal


def encode_manifest(
    meta: CheckpointMeta,
    files: Mapping[str, FileRef],
    layers: Sequence[Layer],
    layout: ManifestLayout = DEFAULT_LAYOUT,
) -> tuple[CID, list[tuple[CID, bytes]]]:
    """Encode a manifest; return its root CID and every node (root first) as (CID, bytes)."""
    extra_nodes: list[tuple[CID, bytes]] = []
    layer_nodes = []
    for layer in layers:
        pages: list[CID] = []
        if len(layer.chunks) > layout.max_inline_chunks:
            for i in range(0, len(layer.chunks), layout.max_inline_chunks):
                part = list(layer.chunks[i : i + layout.max_inline_chunks])
                data = _enc({"type": CHUNK_PAGE_TYPE, "chunks": part}, f"layer {layer.name!r}")
                cid = compute_cid(data, DAG_CBOR)
                extra_nodes.append((cid, data))
                pages.append(cid)
        layer_nodes.append(_layer_node(layer, pages))
    agg = meta.aggregation
    root: dict[str, Any] = {
        "type": ROOT_TYPE,
        "version": limits.MANIFEST_VERSION,
        "kind": meta.kind,
        "run": meta.run_id,
        "epoch": meta.epoch,
        "round": meta.round,
        "step": meta.step,
        "parent": meta.parent,
        "model_config": _json_normal(meta.model_config),
        "tokenizer": {n: {"size": f.size, "chunks": list(f.chunks)} for n, f in files.items()},
        "aggregation": None
        if agg is None
        else {"aggregator": agg.aggregator, "params": agg.params, "updates": list(agg.updates)},
        "extra": meta.extra,
        "layers": layer_nodes,
        "layer_pages": [],
        "layer_count": len(layers),
        "total_bytes": sum(layer.nbytes for layer in layers),
    }
    root_bytes = _encoded_if_fits(root, layout)
    if root_bytes is None:
        page_cids = []
        budget = layout.max_node_size - 64  # room for the page's own type key and list head
        current: list[dict[str, Any]] = []
        used = 0
        for node in layer_nodes:
            size = len(_enc(node, f"layer {node['name']!r}"))
            if current and used + size > budget:
                page_cids.append(_add_page(current, extra_nodes))
                current, used = [], 0
            current.append(node)
            used += size
        if current:
            page_cids.append(_add_page(current, extra_nodes))
        root["layers"] = []
        root["layer_pages"] = page_cids
        root_bytes = _enc(root, "manifest")
        if len(root_bytes) > layout.max_node_size:
            raise CheckpointError("manifest root too large even with layer pages (model_config?)")
    if 1 + len(extra_nodes) > limits.MAX_MANIFEST_NODES:
        raise CheckpointError("manifest would span more than MAX_MANIFEST_NODES nodes")
    root_cid = compute_cid(root_bytes, DAG_CBOR)
    return root_cid, [(root_cid, root_bytes), *extra_nodes]


def _encoded_if_fits(root: dict[str, Any], layout: ManifestLayout) -> bytes | None:
    """The root's bytes if they fit in one node, else None (encoded once: links are costly)."""
    try:
        data = _cbor.encode(root)
    except BlockTooLargeError:
        return None
    except StorageError as exc:
        raise CheckpointError(f"manifest: {exc}") from exc
    return data if len(data) <= layout.max_node_size else None


def _add_page(layers: list[dict[str, Any]], out: list[tuple[CID, bytes]]) -> CID:
    data = _enc({"type": LAYER_PAGE_TYPE, "layers": layers}, "layer page")
    cid = compute_cid(data, DAG_CBOR)
    out.append((cid, data))
    return cid
