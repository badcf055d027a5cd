"""Hugging Face model folders: export a checkpoint for ``from_pretrained``, import one back.

See specs/manifest.md#hugging-face-folders. A folder holds ``config.json`` (the manifest's
model_config), ``model.safetensors`` and the tokenizer files. safetensors stores each tensor's
little-endian bytes contiguously after a JSON header, which is exactly our chunk format, so both
directions stream block by block without torch and without the model in memory.

Tied weights (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) are plain duplicate
layers here: the same chunk CIDs stored once, both names written to the file; transformers ties
them again on load. Only safetensors weights are imported: pickle files are refused.

An exported folder also holds ``cnode-manifest.car``: the manifest's DAG-CBOR nodes (no data).
With it, :func:`import_hf_verified` rebuilds the exact checkpoint a manifest CID names from a
folder that came from anywhere (a Hugging Face repo, a mirror): each 1 MiB slice of each tensor
and of each tokenizer file must hash to the manifest's chunk CID, so the folder's host is
trusted for nothing. See specs/manifest.md#verified-import-of-a-hugging-face-folder.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from . import limits
from ._blockstore import BlockStore
from ._car import export_car, iter_sections, read_header
from ._checkpoint import read_file, read_manifest, save_layers, write_stream
from ._cid import CID, DAG_CBOR, compute_cid
from ._closure import missing_blocks
from ._exceptions import CARError, CheckpointError, HFFolderError, ManifestError
from ._manifest import (
    DTYPES,
    CheckpointMeta,
    Layer,
    Manifest,
    check_layer_name,
    chunk_count,
    chunk_length,
    chunk_offset,
)
from ._unixfs import build_view, recorded_root, safetensors_header

log = structlog.get_logger(__name__)

CONFIG_JSON = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# The manifest's DAG-CBOR nodes as a CAR v1 (root = the manifest): what makes a folder checkable.
MANIFEST_CAR = "cnode-manifest.car"
# Files copied along with the weights when present (tokenizer and generation settings).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "generation_config.json",
)
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.ckpt")
_ST_DTYPES = {code: name for name, (_, code) in DTYPES.items()}


def export_hf(
    store: BlockStore,
    manifest_cid: CID,
    out_dir: Path,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> Path:
    """Write the checkpoint as a Hugging Face model folder (created atomically)."""
    manifest = read_manifest(store, manifest_cid)
    if manifest.model_config is None:
        raise HFFolderError(f"manifest {manifest_cid} has no model_config; HF export needs one")
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.{secrets.token_hex(4)}.tmp")
    try:
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise HFFolderError(f"{out_dir} exists and is not an empty folder")
        tmp.mkdir(parents=True)
        metadata = {"format": "pt", "cnode_manifest": str(manifest_cid)}
        prefix = safetensors_header(manifest.layers, metadata)
        with open(tmp / WEIGHTS, "wb") as f:
            f.write(prefix)
            for layer in manifest.layers:
                for cid in layer.chunks:
                    data = store.get(cid)
                    f.write(data)
                    if on_progress is not None:
                        on_progress(len(data))
            f.flush()
            os.fsync(f.fileno())
        config = json.dumps(manifest.model_config, indent=2, sort_keys=True)
        (tmp / CONFIG_JSON).write_text(config + "\n", encoding="utf-8")
        for name, ref in manifest.tokenizer_files.items():
            (tmp / name).write_bytes(read_file(store, ref))
        export_car(store, manifest_cid, tmp / MANIFEST_CAR, structure_only=True)
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    except OSError as exc:  # no permission, a file in the way, disk full: name the path
        raise HFFolderError(f"cannot write {out_dir}: {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("hf_exported", manifest=str(manifest_cid), path=str(out_dir))
    return out_dir


def _open(path: Path) -> BinaryIO:
    """``path`` opened for reading; HFFolderError naming it if it cannot be."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise HFFolderError(f"cannot read {path}: {exc.strerror}") from exc


def _read_small(path: Path, limit: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit:
            raise HFFolderError(f"{path} is {size} bytes, over the limit of {limit}")
        return path.read_bytes()
    except OSError as exc:
        raise HFFolderError(f"cannot read {path}: {exc.strerror}") from exc


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed")


def _json(path: Path, limit: int) -> Any:
    try:
        return json.loads(_read_small(path, limit), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HFFolderError(f"{path} is not valid JSON: {exc}") from exc


def _weight_files(folder: Path) -> list[Path]:
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    if (folder / WEIGHTS_INDEX).is_file():
        index = _json(folder / WEIGHTS_INDEX, limits.MAX_CONFIG_JSON_SIZE * 16)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise HFFolderError(f"{folder / WEIGHTS_INDEX} has no weight_map")
        names = sorted(set(weight_map.values()))
        for name in names:
            if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
                raise HFFolderError(f"{WEIGHTS_INDEX} names a bad shard file {name!r}")
        return [folder / name for name in names]
    for name in _PICKLE_WEIGHTS:
        if (folder / name).exists():
            raise HFFolderError(f"{folder} has pickle weights ({name}); only safetensors is read")
    raise HFFolderError(f"{folder} has no {WEIGHTS}")


def _st_entries(path: Path, f: Any) -> tuple[int, list[tuple[str, str, tuple[int, ...], int, int]]]:
    """Parse and check a safetensors header; return (data start, entries sorted by offset)."""
    size = os.fstat(f.fileno()).st_size
    raw = f.read(8)
    if len(raw) != 8:
        raise HFFolderError(f"{path.name}: truncated safetensors file")
    (n,) = struct.unpack("<Q", raw)
    if n > limits.MAX_SAFETENSORS_HEADER or 8 + n > size:
        raise HFFolderError(f"{path.name}: safetensors header of {n} bytes is too large")
    try:
        header = json.loads(f.read(n), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HFFolderError(f"{path.name}: bad safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise HFFolderError(f"{path.name}: bad safetensors header")
    header.pop("__metadata__", None)
    entries = []
    for name, info in header.items():
        try:
            check_layer_name(name)
        except ManifestError as exc:
            raise HFFolderError(f"{path.name}: {exc}") from exc
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise HFFolderError(f"{path.name}: tensor {name!r} has a bad header entry")
        dtype = _ST_DTYPES.get(info["dtype"])
        shape = info["shape"]
        offsets = info["data_offsets"]
        if dtype is None:
            bad = info["dtype"]
            raise HFFolderError(f"{path.name}: tensor {name!r} has unsupported dtype {bad!r}")
        if (
            not isinstance(shape, list)
            or len(shape) > limits.MAX_DIMS
            or not all(type(s) is int and 0 <= s <= limits.MAX_DIM_SIZE for s in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
        ):
            raise HFFolderError(f"{path.name}: tensor {name!r} has a bad shape or offsets")
        begin, end = offsets
        if end - begin != math.prod(shape) * DTYPES[dtype][0]:
            raise HFFolderError(
                f"{path.name}: tensor {name!r}: shape {shape} x {dtype} != {end - begin} bytes"
            )
        entries.append((name, dtype, tuple(shape), begin, end))
    entries.sort(key=lambda e: e[3])
    position = 0
    for name, _, _, begin, end in entries:
        if begin != position:
            raise HFFolderError(f"{path.name}: tensor {name!r} does not follow the previous one")
        position = end
    if 8 + n + position != size:
        raise HFFolderError(f"{path.name}: data is {size - 8 - n} bytes, tensors need {position}")
    return 8 + n, entries


def import_hf(
    store: BlockStore,
    folder: Path,
    *,
    run_id: str = "hf-import",
    pin: bool = True,
    allow_nonfinite: bool = False,
    on_progress: Callable[[int], None] | None = None,
) -> CID:
    """Import a Hugging Face model folder (safetensors only) as a checkpoint; return its CID.

    A floating-point tensor holding NaN or Inf is refused (HFFolderError naming it) unless
    ``allow_nonfinite``, when it is imported with a warning naming it. Refused, the chunks
    already stored stay unpinned: no manifest names them, and gc removes them.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise HFFolderError(f"{folder} is not a folder")
    config = _json(folder / CONFIG_JSON, limits.MAX_CONFIG_JSON_SIZE)
    if not isinstance(config, dict):
        raise HFFolderError(f"{folder / CONFIG_JSON} must hold a JSON object")
    files = {
        name: _read_small(folder / name, limits.MAX_TOKENIZER_FILE_SIZE)
        for name in TOKENIZER_FILES
        if (folder / name).is_file()
    }
    meta = CheckpointMeta(
        run_id=run_id, model_config=config, tokenizer_files=files, extra={"source": "hf"}
    )
    weights = _weight_files(folder)
    # Check every header first, so a bad folder stores nothing.
    plans = []
    seen: set[str] = set()
    for path in weights:
        with _open(path) as f:
            start, entries = _st_entries(path, f)
        for name, *_ in entries:
            if name in seen:
                raise HFFolderError(f"duplicate layer name {name!r} in {path.name}")
            seen.add(name)
        plans.append((path, start, entries))

    from ._tensors import NonfiniteCounter  # torch, only for this import

    def layers() -> Iterator[Layer]:
        for path, start, entries in plans:
            with open(path, "rb") as f:
                f.seek(start)
                for name, dtype, shape, begin, end in entries:
                    what = f"{path.name}:{name}"
                    nonfinite = NonfiniteCounter(dtype)
                    chunks = write_stream(store, f, end - begin, what, nonfinite)
                    if nonfinite.count:
                        _nonfinite(what, nonfinite.count, allow_nonfinite)
                    if on_progress is not None:
                        on_progress(end - begin)
                    yield Layer(name, dtype, shape, end - begin, chunks)

    try:
        cid = save_layers(store, layers(), meta)
    except CheckpointError as exc:
        raise HFFolderError(f"{folder}: {exc}") from exc
    if pin:
        store.pin(str(cid), cid)
    log.info("hf_imported", manifest=str(cid), path=str(folder), layers=len(seen))
    return cid


def _nonfinite(what: str, count: int, allowed: bool) -> None:
    if not allowed:
        raise HFFolderError(
            f"tensor {what} holds {count} NaN/Inf values; "
            "import it anyway with --allow-nonfinite (allow_nonfinite=True)"
        )
    log.warning("hf_nonfinite_tensor", tensor=what, nonfinite=count)


def read_hf_manifest(store: BlockStore, folder: Path, manifest_cid: CID) -> Manifest:
    """Store the manifest nodes of ``folder``'s ``cnode-manifest.car``; return the manifest.

    The first step of :func:`import_hf_verified`, on its own so a downloader can learn what else
    to fetch (and how large each file may be) before fetching it. Raises HFFolderError.
    """
    path = Path(folder) / MANIFEST_CAR
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limits.MAX_MANIFEST_SIZE + limits.MAX_CAR_HEADER_SIZE:
            raise HFFolderError(f"{path.name} is {size} bytes, over MAX_MANIFEST_SIZE")
        try:
            root = read_header(f)
            if root != manifest_cid:
                raise HFFolderError(
                    f"{path.name} is the manifest {root}, not the expected {manifest_cid}"
                )
            for cid, data in iter_sections(f):
                if cid.codec != DAG_CBOR:
                    raise HFFolderError(f"{path.name} holds a non-manifest block {cid}")
                if compute_cid(data, DAG_CBOR) != cid:
                    raise HFFolderError(f"{path.name}: block {cid} does not match its CID")
                store.put(cid, data)
        except CARError as exc:
            raise HFFolderError(f"{path.name}: {exc}") from exc
    try:
        return read_manifest(store, manifest_cid)
    except ManifestError as exc:
        raise HFFolderError(f"{MANIFEST_CAR}: {exc}") from exc


def _verified_chunks(
    store: BlockStore, f: Any, nbytes: int, chunks: tuple[CID, ...], what: str
) -> None:
    """Read ``nbytes`` from ``f`` in CHUNK_SIZE slices; each must be the next of ``chunks``."""
    expected = chunk_count(nbytes)
    if len(chunks) != expected:
        raise HFFolderError(
            f"{what}: {nbytes} bytes make {expected} chunks, the manifest lists {len(chunks)}"
        )
    for index, want in enumerate(chunks):
        data = f.read(chunk_length(nbytes, index))
        if compute_cid(data) != want:
            raise HFFolderError(
                f"{what}: bytes {chunk_offset(index)}.. do not match the manifest's chunk "
                f"{want} (the folder does not hold this checkpoint)"
            )
        if not store.has(want):
            store.put(want, data)


def _rebuild_view(store: BlockStore, manifest_cid: CID, manifest: Manifest) -> None:
    """Store the UnixFS view the manifest records: its blocks follow from the manifest alone."""
    recorded = recorded_root(manifest.extra)
    if recorded is None:
        return
    view = build_view(manifest.layers, manifest.model_config, manifest.tokenizer_files)
    if view.root != recorded:
        raise HFFolderError(
            f"manifest {manifest_cid} records UnixFS view {recorded}, its layers give {view.root}"
        )
    for cid, data in reversed(view.blocks):
        store.put(cid, data)


def import_hf_verified(
    store: BlockStore,
    folder: Path,
    manifest_cid: CID,
    *,
    pin: bool = True,
    on_progress: Callable[[int], None] | None = None,
) -> None:
    """Rebuild the checkpoint ``manifest_cid`` from a folder written by :func:`export_hf`.

    The folder's ``cnode-manifest.car`` must hold the manifest ``manifest_cid``; its
    ``model.safetensors`` must hold every layer with the manifest's dtype and shape, and every
    1 MiB slice of a tensor (or of a tokenizer file) must hash to the manifest's chunk CID.
    Blocks are stored as they verify (each is correct whatever happens next); the checkpoint is
    pinned only once complete.

    Raises:
        HFFolderError: the folder is malformed or its bytes are not the manifest's; the message
            names the file and the layer.
    """
    folder = Path(folder)
    manifest = read_hf_manifest(store, folder, manifest_cid)
    path = folder / WEIGHTS
    with _open(path) as f:
        start, entries = _st_entries(path, f)
        where = {name: (dtype, shape, begin, end) for name, dtype, shape, begin, end in entries}
        if set(where) != {layer.name for layer in manifest.layers}:
            extra = sorted(set(where) - {layer.name for layer in manifest.layers})[:3]
            lacking = sorted({layer.name for layer in manifest.layers} - set(where))[:3]
            raise HFFolderError(
                f"{WEIGHTS}: tensors differ from the manifest's layers "
                f"(not in the manifest: {extra}, missing: {lacking})"
            )
        for layer in manifest.layers:
            dtype, shape, begin, end = where[layer.name]
            if (dtype, shape, end - begin) != (layer.dtype, layer.shape, layer.nbytes):
                raise HFFolderError(
                    f"{WEIGHTS}: tensor {layer.name!r} is {dtype} {list(shape)}, the manifest "
                    f"says {layer.dtype} {list(layer.shape)}"
                )
            f.seek(start + begin)
            _verified_chunks(store, f, layer.nbytes, layer.chunks, f"{WEIGHTS}: {layer.name!r}")
            if on_progress is not None:
                on_progress(layer.nbytes)
    for name, ref in manifest.tokenizer_files.items():
        with _open(folder / name) as g:
            if os.fstat(g.fileno()).st_size != ref.size:
                raise HFFolderError(f"{name} is not the manifest's ({ref.size} bytes)")
            _verified_chunks(store, g, ref.size, ref.chunks, name)
    _rebuild_view(store, manifest_cid, manifest)
    missing = missing_blocks(store, manifest_cid)
    if missing:  # cannot happen after the checks above; a loud error if it ever does
        raise HFFolderError(f"{folder}: {len(missing)} blocks still missing, e.g. {missing[0]}")
    if pin:
        store.pin(str(manifest_cid), manifest_cid)
    log.info("hf_verified_import", manifest=str(manifest_cid), path=str(folder))
