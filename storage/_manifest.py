"""The checkpoint manifest: dataclasses, and the one encode and one decode path of its nodes.

Schema: specs/manifest.md#manifest. A manifest is a root DAG-CBOR node, optionally followed by
linked layer pages (when the layer list would make the root larger than one block) and chunk
pages (when one layer has more than MAX_CHUNKS_PER_NODE chunks). Every field read from a node is
type- and range-checked against limits.py; unknown or missing keys are errors (the schema is
versioned: a new field means a new ``version``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _cbor, limits
from ._cid import CID, DAG_CBOR, RAW
from ._exceptions import BlockTooLargeError, ManifestError, StorageError
from ._memo import ParseMemo

ROOT_TYPE = "cnode/manifest"
LAYER_PAGE_TYPE = "cnode/layer-page"
CHUNK_PAGE_TYPE = "cnode/chunk-page"
KINDS = ("checkpoint", "update")

# dtype name -> (bytes per element, safetensors dtype code). Bytes are little-endian.
DTYPES: dict[str, tuple[int, str]] = {
    "float64": (8, "F64"),
    "float32": (4, "F32"),
    "float16": (2, "F16"),
    "bfloat16": (2, "BF16"),
    "int64": (8, "I64"),
    "int32": (4, "I32"),
    "int16": (2, "I16"),
    "int8": (1, "I8"),
    "uint8": (1, "U8"),
    "bool": (1, "BOOL"),
}

# Layer names are dotted paths of plain words ("transformer.h.0.attn.c_attn.weight"): no "/",
# "\\", "..", leading or trailing ".", spaces or control characters, so a name is always safe as
# a file or key name anywhere it ends up.
_LAYER_NAME = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
# Side-file names (tokenizer files) become file names in an exported folder.
_FILE_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*$")
_RESERVED_FILES = frozenset({"config.json", "model.safetensors", "model.safetensors.index.json"})


def check_layer_name(name: object) -> str:
    """Return ``name`` if it is an allowed layer name; else raise ManifestError saying why."""
    if not isinstance(name, str) or not name:
        raise ManifestError(f"layer name must be a non-empty string, got {name!r}")
    if len(name.encode("utf-8")) > limits.MAX_LAYER_NAME_LEN:
        raise ManifestError(f"layer name longer than MAX_LAYER_NAME_LEN: {name[:60]!r}...")
    if not _LAYER_NAME.match(name):
        raise ManifestError(
            f"bad layer name {name!r}: use dotted words of letters, digits, '_' and '-' "
            "(no '/', '\\\\', '..', leading or trailing '.', spaces)"
        )
    return name


def check_file_name(name: object) -> str:
    """Return ``name`` if it is an allowed side-file name; else raise ManifestError."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > limits.MAX_FILE_NAME_LEN
        or not _FILE_NAME.match(name)
        or ".." in name
        or name in _RESERVED_FILES
    ):
        raise ManifestError(
            f"bad file name {name!r}: plain names only, not {', '.join(sorted(_RESERVED_FILES))}"
        )
    return name


def iter_chunks(data: memoryview) -> Iterator[memoryview]:
    """The ``CHUNK_SIZE`` slices a layer's bytes are cut into: the one chunking rule.

    The last slice may be shorter; an empty tensor has none. Checkpoints and state CIDs both cut
    here, so their chunk CIDs agree.
    """
    for off in range(0, len(data), limits.CHUNK_SIZE):
        yield data[off : off + limits.CHUNK_SIZE]


def chunk_count(nbytes: int) -> int:
    """How many chunks ``nbytes`` bytes are cut into (0 for none)."""
    return math.ceil(nbytes / limits.CHUNK_SIZE)


def chunk_offset(index: int) -> int:
    """Where chunk ``index`` starts in its tensor's (or file's) bytes."""
    return index * limits.CHUNK_SIZE


def chunk_length(nbytes: int, index: int) -> int:
    """Length of chunk ``index`` of a tensor (or file) of ``nbytes`` bytes."""
    return min(limits.CHUNK_SIZE, nbytes - chunk_offset(index))


# -- dataclasses --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AggregationRecord:
    """How a checkpoint was made from a round: aggregator, its parameters, the signed updates."""

    aggregator: str
    params: dict[str, Any] = field(default_factory=dict)
    updates: Sequence[CID] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "updates", tuple(self.updates))


@dataclass(frozen=True)
class CheckpointMeta:
    """What save_checkpoint writes next to the tensors."""

    run_id: str
    kind: str = "checkpoint"  # "checkpoint" | "update"
    epoch: int = 0
    round: int = 0
    step: int = 0
    parent: CID | None = None
    model_config: dict[str, Any] | None = None
    tokenizer_files: dict[str, bytes] | None = None
    aggregation: AggregationRecord | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FileRef:
    """A side file (tokenizer) stored as raw chunks."""

    size: int
    chunks: tuple[CID, ...]


@dataclass(frozen=True)
class Layer:
    """One tensor: its little-endian bytes are ``chunks`` concatenated."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunks: tuple[CID, ...]


@dataclass(frozen=True)
class Manifest:
    """A decoded, validated manifest (all linked nodes resolved)."""

    version: int
    kind: str
    run_id: str
    epoch: int
    round: int
    step: int
    parent: CID | None
    model_config: dict[str, Any] | None
    tokenizer_files: dict[str, FileRef]
    aggregation: AggregationRecord | None
    extra: dict[str, Any]
    layers: tuple[Layer, ...]

    @property
    def total_bytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)


# -- field checks -------------------------------------------------------------------------------


def _keys(node: object, keys: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise ManifestError(f"{what} must be a map")
    got = set(node)
    if got != keys:
        parts = []
        if keys - got:
            parts.append(f"missing {sorted(keys - got)}")
        if got - keys:
            parts.append(f"unknown {sorted(got - keys)}")
        raise ManifestError(f"{what}: {', '.join(parts)}")
    return node


def _int(value: object, what: str, hi: int) -> int:
    if type(value) is not int or not 0 <= value <= hi:
        raise ManifestError(f"{what} must be an integer in 0..{hi}, got {value!r}")
    return value


def _str(value: object, what: str, hi: int = limits.MAX_SHORT_STRING) -> str:
    if not isinstance(value, str) or len(value.encode("utf-8")) > hi:
        raise ManifestError(f"{what} must be a string of at most {hi} bytes")
    return value


def _cid(value: object, what: str, codec: int) -> CID:
    if not isinstance(value, CID) or value.codec != codec:
        name = "raw" if codec == RAW else "dag-cbor"
        raise ManifestError(f"{what} must be a {name} CID link, got {value!r}"[:200])
    return value


def _cids(value: object, what: str, codec: int, hi: int) -> tuple[CID, ...]:
    if not isinstance(value, list) or len(value) > hi:
        raise ManifestError(f"{what} must be a list of at most {hi} links")
    for i, v in enumerate(value):  # a link's name is formatted for the error only (issue 41)
        if type(v) is not CID or v.codec != codec:
            _cid(v, f"{what}[{i}]", codec)
    return tuple(value)


def _map(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{what} must be a map")
    return value


# -- nodes --------------------------------------------------------------------------------------

_ROOT_KEYS = frozenset(
    {"type", "version", "kind", "run", "epoch", "round", "step", "parent", "model_config",
     "tokenizer", "aggregation", "extra", "layers", "layer_pages", "layer_count", "total_bytes"}
)  # fmt: skip
_LAYER_KEYS = frozenset({"name", "dtype", "shape", "size", "chunks", "chunk_pages"})
_PAGE_KEYS = frozenset({"type", "layers"})
_CHUNK_PAGE_KEYS = frozenset({"type", "chunks"})
_FILE_KEYS = frozenset({"size", "chunks"})
_AGG_KEYS = frozenset({"aggregator", "params", "updates"})


@dataclass(frozen=True)
class PartialLayer:
    """A layer node as decoded: chunks inline, or the CIDs of its chunk pages."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunks: tuple[CID, ...]
    chunk_pages: tuple[CID, ...]


@dataclass(frozen=True)
class RootNode:
    """The root node as decoded; layers may continue in ``layer_pages``."""

    meta: Manifest  # with only the inline layers that are complete; see ``layers``
    layers: tuple[PartialLayer, ...]
    layer_pages: tuple[CID, ...]
    layer_count: int
    total_bytes: int


def _decode(data: bytes, what: str) -> Any:
    try:
        return _cbor.decode(data)
    except (StorageError, BlockTooLargeError) as exc:
        raise ManifestError(f"{what}: {exc}") from exc


def parse_layer(node: object) -> PartialLayer:
    """Check one layer node (schema, name, dtype, shape x dtype = size, chunk count)."""
    raw_name = node.get("name") if isinstance(node, dict) else None
    what = f"layer {raw_name!r}" if isinstance(raw_name, str) else "layer"
    d = _keys(node, _LAYER_KEYS, what)
    name = check_layer_name(d["name"])
    what = f"layer {name!r}"
    dtype = d["dtype"]
    if dtype not in DTYPES:
        raise ManifestError(f"{what}: unknown dtype {dtype!r} (allowed: {', '.join(DTYPES)})")
    shape_raw = d["shape"]
    if not isinstance(shape_raw, list) or len(shape_raw) > limits.MAX_DIMS:
        raise ManifestError(f"{what}: shape must be a list of at most MAX_DIMS {limits.MAX_DIMS}")
    shape = tuple(_int(s, f"{what} shape (MAX_DIM_SIZE)", limits.MAX_DIM_SIZE) for s in shape_raw)
    nbytes = _int(d["size"], f"{what} size (MAX_LAYER_BYTES)", limits.MAX_LAYER_BYTES)
    expected = math.prod(shape) * DTYPES[dtype][0]
    if expected != nbytes:
        raise ManifestError(
            f"{what}: shape {list(shape)} x {dtype} is {expected} bytes but size says {nbytes}"
        )
    chunks = _cids(d["chunks"], f"{what} chunks", RAW, limits.MAX_CHUNKS_PER_NODE)
    pages = _cids(d["chunk_pages"], f"{what} chunk_pages", DAG_CBOR, limits.MAX_MANIFEST_NODES)
    if pages and chunks:
        raise ManifestError(f"{what}: has both inline chunks and chunk pages")
    if not pages and len(chunks) != chunk_count(nbytes):
        raise ManifestError(
            f"{what}: {len(chunks)} chunks listed, {chunk_count(nbytes)} needed for {nbytes} bytes"
        )
    return PartialLayer(name, dtype, shape, nbytes, chunks, pages)


def _parse_file(node: object, name: str) -> FileRef:
    d = _keys(node, _FILE_KEYS, f"file {name!r}")
    size = _int(
        d["size"], f"file {name!r} size (MAX_TOKENIZER_FILE_SIZE)", limits.MAX_TOKENIZER_FILE_SIZE
    )
    chunks = _cids(d["chunks"], f"file {name!r} chunks", RAW, limits.MAX_CHUNKS_PER_NODE)
    if len(chunks) != chunk_count(size):
        raise ManifestError(f"file {name!r}: {len(chunks)} chunks for {size} bytes")
    return FileRef(size, chunks)


def _parse_aggregation(node: object) -> AggregationRecord | None:
    if node is None:
        return None
    d = _keys(node, _AGG_KEYS, "aggregation")
    return AggregationRecord(
        aggregator=_str(d["aggregator"], "aggregation.aggregator"),
        params=_map(d["params"], "aggregation.params"),
        updates=_cids(
            d["updates"], "aggregation.updates", DAG_CBOR, limits.MAX_AGGREGATION_UPDATES
        ),
    )


def _parse_layers(raw: list[Any], errors: list[str] | None) -> tuple[PartialLayer, ...]:
    if errors is None:
        return tuple(parse_layer(x) for x in raw)
    out = []
    for x in raw:
        try:
            out.append(parse_layer(x))
        except ManifestError as exc:
            errors.append(str(exc))
    return tuple(out)


def _own_root(root: RootNode) -> RootNode:
    """``root`` with its own copies of the dicts a caller could change (model_config, extra...)."""
    m = root.meta
    agg = m.aggregation
    if agg is not None:
        agg = dataclasses.replace(agg, params=copy.deepcopy(agg.params))
    meta = dataclasses.replace(
        m,
        model_config=copy.deepcopy(m.model_config),
        tokenizer_files=dict(m.tokenizer_files),
        aggregation=agg,
        extra=copy.deepcopy(m.extra),
    )
    return dataclasses.replace(root, meta=meta)


# Strict parses of nodes seen before (``_memo``): a round reads the same manifests many times.
_ROOTS: ParseMemo[RootNode] = ParseMemo(_own_root)
_LAYER_PAGES: ParseMemo[tuple[PartialLayer, ...]] = ParseMemo()
_CHUNK_PAGES: ParseMemo[tuple[CID, ...]] = ParseMemo()


def parse_root(data: bytes, errors: list[str] | None = None) -> RootNode:
    """Decode and check a root manifest node (not its pages).

    With ``errors`` given, a bad layer entry is skipped and its message appended there (verify
    uses this to name every bad layer); anything else still raises ManifestError.
    """
    if errors is not None:
        return _parse_root(data, errors)
    return _ROOTS.parse(data, lambda: _parse_root(data, None))


def _parse_root(data: bytes, errors: list[str] | None) -> RootNode:
    d = _keys(_decode(data, "manifest"), _ROOT_KEYS, "manifest")
    if d["type"] != ROOT_TYPE:
        raise ManifestError(f"not a cnode manifest (type {d['type']!r})"[:200])
    if d["version"] != limits.MANIFEST_VERSION or type(d["version"]) is not int:
        raise ManifestError(
            f"manifest version {d['version']!r} not supported (this cnode reads "
            f"{limits.MANIFEST_VERSION})"[:200]
        )
    kind = d["kind"]
    if kind not in KINDS:
        raise ManifestError(f"manifest kind must be one of {KINDS}, got {kind!r}"[:200])
    parent = None if d["parent"] is None else _cid(d["parent"], "parent", DAG_CBOR)
    config = None if d["model_config"] is None else _map(d["model_config"], "model_config")
    tok = _map(d["tokenizer"], "tokenizer")
    if len(tok) > limits.MAX_TOKENIZER_FILES:
        raise ManifestError(f"more than MAX_TOKENIZER_FILES {limits.MAX_TOKENIZER_FILES} files")
    files = {check_file_name(n): _parse_file(v, n) for n, v in tok.items()}
    layers_raw = d["layers"]
    if not isinstance(layers_raw, list) or len(layers_raw) > limits.MAX_LAYERS:
        raise ManifestError(f"layers must be a list of at most MAX_LAYERS {limits.MAX_LAYERS}")
    layers = _parse_layers(layers_raw, errors)
    pages = _cids(d["layer_pages"], "layer_pages", DAG_CBOR, limits.MAX_MANIFEST_NODES)
    meta = Manifest(
        version=limits.MANIFEST_VERSION,
        kind=kind,
        run_id=_str(d["run"], "run"),
        epoch=_int(d["epoch"], "epoch", 2**63 - 1),
        round=_int(d["round"], "round", 2**63 - 1),
        step=_int(d["step"], "step", 2**63 - 1),
        parent=parent,
        model_config=config,
        tokenizer_files=files,
        aggregation=_parse_aggregation(d["aggregation"]),
        extra=_map(d["extra"], "extra"),
        layers=(),
    )
    return RootNode(
        meta=meta,
        layers=layers,
        layer_pages=pages,
        layer_count=_int(d["layer_count"], "layer_count (MAX_LAYERS)", limits.MAX_LAYERS),
        total_bytes=_int(d["total_bytes"], "total_bytes (MAX_TOTAL_BYTES)", limits.MAX_TOTAL_BYTES),
    )


def parse_layer_page(data: bytes, errors: list[str] | None = None) -> tuple[PartialLayer, ...]:
    if errors is not None:
        return _parse_layer_page(data, errors)
    return _LAYER_PAGES.parse(data, lambda: _parse_layer_page(data, None))


def _parse_layer_page(data: bytes, errors: list[str] | None) -> tuple[PartialLayer, ...]:
    d = _keys(_decode(data, "layer page"), _PAGE_KEYS, "layer page")
    if d["type"] != LAYER_PAGE_TYPE:
        raise ManifestError("layer page has the wrong type")
    raw = d["layers"]
    if not isinstance(raw, list) or len(raw) > limits.MAX_LAYERS:
        raise ManifestError("layer page: layers must be a list")
    return _parse_layers(raw, errors)


def parse_chunk_page(data: bytes) -> tuple[CID, ...]:
    return _CHUNK_PAGES.parse(data, lambda: _parse_chunk_page(data))


def _parse_chunk_page(data: bytes) -> tuple[CID, ...]:
    d = _keys(_decode(data, "chunk page"), _CHUNK_PAGE_KEYS, "chunk page")
    if d["type"] != CHUNK_PAGE_TYPE:
        raise ManifestError("chunk page has the wrong type")
    return _cids(d["chunks"], "chunk page", RAW, limits.MAX_CHUNKS_PER_NODE)
