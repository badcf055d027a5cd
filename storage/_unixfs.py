"""A checkpoint's UnixFS view: the same blocks, seen as a folder ``from_pretrained`` loads.

See specs/manifest.md#unixfs-view. The view is a UnixFS directory (DAG-PB) holding:

* ``config.json`` — the manifest's ``model_config`` written as ``export --hf`` writes it;
* ``model.safetensors`` — a UnixFS file whose leaves are the safetensors header (one or more
  small raw blocks) followed by every layer's own raw chunks in manifest order, so no tensor
  byte is stored twice; file nodes link at most UNIXFS_FANOUT children and record each child's
  size (``blocksizes``), level by level up to one root;
* each tokenizer file, its raw chunks as leaves (a one-chunk file is its chunk).

The view is a pure function of the manifest: :func:`build_view` gives the same blocks on every
machine, so a reader recomputes it to check the directory CID the manifest records, and a
holder can rebuild the few blocks it adds (header, config, DAG-PB nodes) from the manifest alone.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import limits
from ._cid import CID, DAG_PB, RAW, compute_cid
from ._dagpb import PBLink, encode_node, unixfs_directory, unixfs_file
from ._manifest import DTYPES, FileRef, Layer, chunk_length, iter_chunks
from ._walk import BlockReader, resolve

CONFIG_JSON = "config.json"
WEIGHTS = "model.safetensors"
# The key under the manifest's ``extra`` map that records the view's directory CID.
EXTRA_KEY = "unixfs"


@dataclass(frozen=True)
class UnixFSView:
    """The directory CID and the blocks the view adds to the checkpoint's own chunks.

    ``blocks`` lists (CID, bytes) parents first: the directory, then per file its DAG-PB nodes
    top-down and the raw blocks cnode writes for it (header, config.json).
    """

    root: CID
    blocks: tuple[tuple[CID, bytes], ...]
    files: dict[str, CID]

    def cids(self) -> list[CID]:
        return [cid for cid, _ in self.blocks]


def config_json(model_config: Mapping[str, Any]) -> bytes:
    """config.json as ``export --hf`` writes it (sorted keys, 2-space indent, final newline)."""
    return (json.dumps(model_config, indent=2, sort_keys=True) + "\n").encode("utf-8")


def safetensors_header(
    layers: Sequence[Layer], metadata: Mapping[str, str] | None = None
) -> bytes:
    """The safetensors prefix (8-byte length + JSON, padded to 8) for ``layers`` in order.

    The view's metadata is ``{"format": "pt"}`` only: the file cannot name the manifest that
    names it. ``export --hf`` adds ``cnode_manifest`` (its folder sits beside the manifest).
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for layer in layers:
        header[layer.name] = {
            "dtype": DTYPES[layer.dtype][1],
            "shape": list(layer.shape),
            "data_offsets": [offset, offset + layer.nbytes],
        }
        offset += layer.nbytes
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # safetensors aligns the data start to 8 bytes
    return struct.pack("<Q", len(head)) + head


class _Builder:
    def __init__(self) -> None:
        self.out: dict[CID, bytes] = {}

    def raw(self, data: bytes) -> list[tuple[CID, int, int]]:
        """Leaves for bytes cnode writes itself, cut at CHUNK_SIZE (an empty file: one leaf)."""
        pieces = [bytes(piece) for piece in iter_chunks(memoryview(data))]
        leaves = []
        for piece in pieces or [b""]:
            cid = compute_cid(piece, RAW)
            self.out[cid] = piece
            leaves.append((cid, len(piece), len(piece)))
        return leaves

    def file(self, leaves: list[tuple[CID, int, int]]) -> tuple[CID, int]:
        """A balanced file tree over ``leaves`` (cid, tsize, filesize); return (root, tsize)."""
        level = leaves
        while len(level) > 1:
            parents = []
            for start in range(0, len(level), limits.UNIXFS_FANOUT):
                group = level[start : start + limits.UNIXFS_FANOUT]
                data = encode_node(
                    [PBLink(cid, "", tsize) for cid, tsize, _ in group],
                    unixfs_file([size for _, _, size in group]),
                )
                cid = compute_cid(data, DAG_PB)
                self.out[cid] = data
                parents.append(
                    (cid, len(data) + sum(t for _, t, _ in group), sum(s for _, _, s in group))
                )
            level = parents
        return level[0][0], level[0][1]


def _chunk_leaves(chunks: Sequence[CID], nbytes: int) -> list[tuple[CID, int, int]]:
    sizes = [chunk_length(nbytes, i) for i in range(len(chunks))]
    return [(cid, size, size) for cid, size in zip(chunks, sizes, strict=True)]


def build_view(
    layers: Sequence[Layer],
    model_config: Mapping[str, Any] | None,
    tokenizer_files: Mapping[str, FileRef],
) -> UnixFSView:
    """The UnixFS view of a checkpoint with these layers, config and side files."""
    b = _Builder()
    entries: dict[str, tuple[CID, int]] = {}
    if model_config is not None:
        entries[CONFIG_JSON] = b.file(b.raw(config_json(model_config)))
    leaves = b.raw(safetensors_header(layers))
    for layer in layers:
        leaves += _chunk_leaves(layer.chunks, layer.nbytes)
    entries[WEIGHTS] = b.file(leaves)
    for name, ref in tokenizer_files.items():
        entries[name] = b.file(_chunk_leaves(ref.chunks, ref.size) or b.raw(b""))
    links = [PBLink(cid, name, tsize) for name, (cid, tsize) in entries.items()]
    data = encode_node(links, unixfs_directory())
    root = compute_cid(data, DAG_PB)
    ordered = [(root, data), *reversed(list(b.out.items()))]
    return UnixFSView(root, tuple(ordered), {name: cid for name, (cid, _) in entries.items()})


def recorded_root(extra: Mapping[str, Any]) -> CID | None:
    """The directory CID a manifest's ``extra`` records, or None (an older manifest)."""
    value = extra.get(EXTRA_KEY)
    return value if isinstance(value, CID) else None


def unixfs_view(store: BlockReader, manifest_cid: CID) -> UnixFSView:
    """Rebuild the UnixFS view of the checkpoint at ``manifest_cid`` from its manifest.

    Raises what :func:`resolve` raises for an absent or bad manifest; the result's ``root`` is
    what a correct manifest records under ``extra["unixfs"]`` (compare with :func:`recorded_root`).
    """
    manifest = resolve(manifest_cid, store.get)
    return build_view(manifest.layers, manifest.model_config, manifest.tokenizer_files)
