"""Checkpoints: state dict <-> chunks + manifest in a BlockStore. See specs/manifest.md.

Saving streams each tensor's own memory, 1 MiB at a time, into the store; loading fills a tensor
allocated once with verified chunk bytes read straight from disk. Neither ever holds a second copy
of the model (only a non-contiguous or non-CPU tensor is copied, one tensor at a time).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import structlog

from . import limits
from ._blockstore import BlockStore
from ._cid import CID, DAG_CBOR, RAW
from ._closure import missing_blocks
from ._encode import DEFAULT_LAYOUT, ManifestLayout, encode_manifest
from ._exceptions import (
    BlockNotFoundError,
    CheckpointError,
    CorruptBlockError,
    ManifestError,
)
from ._manifest import (
    KINDS,
    CheckpointMeta,
    FileRef,
    Layer,
    Manifest,
    check_file_name,
    check_layer_name,
    chunk_count,
    chunk_length,
    chunk_offset,
    iter_chunks,
    parse_root,
)
from ._unixfs import EXTRA_KEY, build_view
from ._unsynced import UnsyncedBatch
from ._walk import BlockReader, resolve

if TYPE_CHECKING:  # torch is imported only by the functions that need it (fast CLI start)
    import torch

log = structlog.get_logger(__name__)


# A save of at least this many chunks writes them in one unsynced batch, synced once before the
# manifest (specs/blocks.md#durability, D5): a batch costs two small fsyncs and one syncfs, a
# per-block fsync 1-8 ms (idle to busy disk), 64-104 of them per partitioned round before.
UNSYNCED_SAVE_MIN_CHUNKS = 4


def write_chunks(
    store: BlockStore, data: memoryview, batch: UnsyncedBatch | None = None
) -> tuple[CID, ...]:
    """Cut ``data`` into CHUNK_SIZE slices and store each; return their CIDs (hashed ahead in
    worker threads when there are more than HASH_AHEAD of them: BlockStore.put_new_all)."""
    if len(data) <= limits.HASH_AHEAD * limits.CHUNK_SIZE:
        return tuple(store.put_new(chunk, RAW, batch=batch) for chunk in iter_chunks(data))
    return store.put_new_all(iter_chunks(data), RAW, batch=batch)


def write_stream(
    store: BlockStore,
    stream: BinaryIO,
    nbytes: int,
    what: str,
    inspect: Callable[[memoryview], None] | None = None,
) -> tuple[CID, ...]:
    """Store exactly ``nbytes`` read from ``stream`` as chunks (HF import reads files this way).

    ``inspect`` sees each chunk before it is stored (HF import counts NaN/Inf with it).
    """
    buf = bytearray(limits.CHUNK_SIZE)
    cids = []
    for index in range(chunk_count(nbytes)):
        want = chunk_length(nbytes, index)
        view = memoryview(buf)[:want]
        got = 0
        while got < want:
            n = stream.readinto(view[got:])  # type: ignore[attr-defined]
            if not n:
                raise CheckpointError(
                    f"{what}: file ends {nbytes - chunk_offset(index) - got} bytes early"
                )
            got += n
        if inspect is not None:
            inspect(view)
        cids.append(store.put_new(view, RAW))
    return tuple(cids)


def _check_meta(meta: CheckpointMeta) -> None:
    if meta.kind not in KINDS:
        raise CheckpointError(f"kind must be one of {KINDS}, got {meta.kind!r}")
    if not isinstance(meta.run_id, str) or not meta.run_id:
        raise CheckpointError("run_id must be a non-empty string")
    for field in ("epoch", "round", "step"):
        value = getattr(meta, field)
        if type(value) is not int or value < 0:
            raise CheckpointError(f"{field} must be a non-negative integer, got {value!r}")
    files = meta.tokenizer_files or {}
    if len(files) > limits.MAX_TOKENIZER_FILES:
        raise CheckpointError(f"more than MAX_TOKENIZER_FILES {limits.MAX_TOKENIZER_FILES} files")
    for name, data in files.items():
        try:
            check_file_name(name)
        except ManifestError as exc:
            raise CheckpointError(str(exc)) from exc
        if not isinstance(data, bytes | bytearray) or len(data) > limits.MAX_TOKENIZER_FILE_SIZE:
            raise CheckpointError(f"tokenizer file {name!r} must be bytes of at most 64 MiB")
    # Everything else (model_config, extra, aggregation) must survive the manifest's own codec.
    _, nodes = encode_manifest(meta, {}, [])
    try:
        parse_root(nodes[0][1])
    except ManifestError as exc:
        raise CheckpointError(f"bad checkpoint meta: {exc}") from exc


def save_layers(
    store: BlockStore,
    layers: Iterator[Layer],
    meta: CheckpointMeta,
    layout: ManifestLayout = DEFAULT_LAYOUT,
) -> CID:
    """Write the manifest for layers whose chunks are already stored; return its CID."""
    files = {}
    for name, data in (meta.tokenizer_files or {}).items():
        view = memoryview(bytes(data))
        files[name] = FileRef(len(view), write_chunks(store, view))
    all_layers = list(layers)
    meta = _with_view(store, meta, files, all_layers)
    root_cid, nodes = encode_manifest(meta, files, all_layers, layout)
    # Linked nodes first, root last: a held root always has its pages.
    for cid, data in reversed(nodes):
        store.put(cid, data)
    log.info(
        "checkpoint_saved",
        manifest=str(root_cid),
        run=meta.run_id,
        kind=meta.kind,
        round=meta.round,
        layers=len(all_layers),
        bytes=sum(layer.nbytes for layer in all_layers),
    )
    return root_cid


def _with_view(
    store: BlockStore, meta: CheckpointMeta, files: dict[str, FileRef], layers: list[Layer]
) -> CheckpointMeta:
    """Store a checkpoint's UnixFS view and record its directory CID in ``extra``.

    specs/manifest.md#unixfs-view. Updates get no view. The view is built from the config as
    the manifest will decode it, so a reader rebuilds exactly the same blocks.
    """
    if meta.kind != "checkpoint":
        return meta
    _, nodes = encode_manifest(meta, files, [])
    view = build_view(layers, parse_root(nodes[0][1]).meta.model_config, files)
    for cid, data in reversed(view.blocks):  # leaves and file nodes first, directory last
        store.put(cid, data)
    return dataclasses.replace(meta, extra={**meta.extra, EXTRA_KEY: view.root})


def save_checkpoint(
    store: BlockStore,
    state_dict: Mapping[str, torch.Tensor],
    meta: CheckpointMeta,
    *,
    layout: ManifestLayout = DEFAULT_LAYOUT,
) -> CID:
    """Store every tensor of ``state_dict`` as 1 MiB chunks plus a manifest; return its CID.

    Layers keep the state dict's order. Raises CheckpointError (bad name, dtype or meta) before
    anything is written.
    """
    from ._tensors import check_tensor, tensor_bytes

    if sys.byteorder != "little":
        raise CheckpointError("big-endian hosts are not supported (tensor bytes are little-endian)")
    _check_meta(meta)
    if len(state_dict) > limits.MAX_LAYERS:
        raise CheckpointError(f"more than MAX_LAYERS {limits.MAX_LAYERS} tensors")
    total = count = 0
    for name, tensor in state_dict.items():
        try:
            check_layer_name(name)
        except ManifestError as exc:
            raise CheckpointError(str(exc)) from exc
        nbytes = check_tensor(name, tensor)
        total += nbytes
        count += chunk_count(nbytes)
    if total > limits.MAX_TOTAL_BYTES:
        raise CheckpointError("checkpoint exceeds MAX_TOTAL_BYTES")

    # Many chunks: written without a per-block fsync, made durable together before the manifest
    # that names them is stored (specs/blocks.md#durability, D5).
    batch = store.unsynced_save() if count >= UNSYNCED_SAVE_MIN_CHUNKS else None
    layers = []
    try:
        for name, tensor in state_dict.items():
            dtype, data = tensor_bytes(name, tensor)
            chunks = write_chunks(store, data, batch)
            layers.append(Layer(name, dtype, tuple(tensor.shape), len(data), chunks))
            del data
    finally:
        if batch is not None:
            batch.commit()  # also after an error: what was written is synced, the marker goes
    return save_layers(store, iter(layers), meta, layout)


def read_manifest(store: BlockReader, manifest_cid: CID) -> Manifest:
    """Decode the manifest and its linked nodes under the limits.

    Raises BlockNotFoundError / CorruptBlockError for absent or bad nodes, ManifestError when a
    node breaks the schema.
    """
    if manifest_cid.codec != DAG_CBOR:
        raise ManifestError(f"{manifest_cid} is a raw block, not a manifest")
    return resolve(manifest_cid, store.get)


def load_layer(store: BlockStore, layer: Layer) -> torch.Tensor:
    """One tensor, allocated once and filled with verified chunk bytes."""
    from ._tensors import load_layer as load

    return load(store, layer)


def tensor_layer(name: str, tensor: torch.Tensor) -> Layer:
    """The manifest entry ``save_checkpoint`` would write for ``tensor``, without storing it."""
    from ._tensors import tensor_layer as layer

    return layer(name, tensor)


def load_checkpoint(
    store: BlockStore, manifest_cid: CID
) -> tuple[dict[str, torch.Tensor], Manifest]:
    """The state dict and manifest of a stored checkpoint; every chunk verified on the way."""
    manifest = read_manifest(store, manifest_cid)
    tensors = {layer.name: load_layer(store, layer) for layer in manifest.layers}
    return tensors, manifest


def read_file(store: BlockStore, ref: FileRef) -> bytes:
    """The bytes of a side file (tokenizer file), verified."""
    data = b"".join(store.get(cid) for cid in ref.chunks)
    if len(data) != ref.size:
        raise ManifestError(f"side file is {len(data)} bytes, manifest says {ref.size}")
    return data


def read_tokenizer_files(store: BlockStore, manifest: Manifest) -> dict[str, bytes]:
    return {name: read_file(store, ref) for name, ref in manifest.tokenizer_files.items()}


@dataclass(frozen=True)
class CheckpointInfo:
    """One manifest found in a store (for ``cnode checkpoint ls``)."""

    cid: CID
    kind: str
    run_id: str
    epoch: int
    round: int
    step: int
    layers: int
    total_bytes: int
    pins: tuple[str, ...]
    missing: int  # blocks known to be missing (0 = complete)


def list_checkpoints(store: BlockStore) -> list[CheckpointInfo]:
    """Every manifest root held, pinned or not, sorted by run, epoch, round, step."""
    pins: dict[CID, list[str]] = {}
    for name, cid in store.pins().items():
        pins.setdefault(cid, []).append(name)
    out = []
    for cid in store.iter_cids():
        if cid.codec != DAG_CBOR:
            continue
        try:
            root = parse_root(store.get(cid))
        except (ManifestError, BlockNotFoundError, CorruptBlockError):
            continue  # pages, envelopes, other DAG-CBOR, or a block quarantined just now
        m = root.meta
        out.append(
            CheckpointInfo(
                cid=cid,
                kind=m.kind,
                run_id=m.run_id,
                epoch=m.epoch,
                round=m.round,
                step=m.step,
                layers=root.layer_count,
                total_bytes=root.total_bytes,
                pins=tuple(pins.get(cid, ())),
                missing=len(missing_blocks(store, cid)),
            )
        )
    out.sort(key=lambda i: (i.run_id, i.epoch, i.round, i.step, str(i.cid)))
    return out
