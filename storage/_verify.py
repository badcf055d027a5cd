"""``cnode checkpoint verify``: check a stored checkpoint and name every fault.

Checks, in order (specs/manifest.md#verification): the manifest root is held, hashes right and
decodes under the limits; every layer page and chunk page likewise; every layer's name, dtype,
shape and byte length agree; every chunk and side-file block is present, hashes to its CID and has
the length the layer needs; the updates named by the aggregation record, where held, hash right
and are manifests of kind "update". A corrupt block is quarantined as soon as it is found.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _cbor
from ._blockstore import BlockChecker, BlockStore
from ._cid import CID, DAG_PB
from ._exceptions import BlockNotFoundError, CorruptBlockError, ManifestError, StorageError
from ._manifest import Manifest, PartialLayer, RootNode, chunk_count, chunk_length, parse_root
from ._unixfs import EXTRA_KEY, build_view
from ._walk import ManifestWalk, resolve, walk_manifest

# Threads hashing blocks at once: reads and sha256 release the GIL, so two cores both hash.
VERIFY_WORKERS = 4


@dataclass(frozen=True)
class Fault:
    """One thing wrong with a checkpoint. ``kind`` is a stable word scripts may match on."""

    kind: str
    message: str
    cid: str | None = None
    layer: str | None = None


@dataclass
class VerifyReport:
    """What verify found; ``ok`` only when there is no fault."""

    manifest_cid: str
    faults: list[Fault] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    layers: int = 0
    blocks_checked: int = 0
    bytes_checked: int = 0
    manifest: Manifest | None = None

    @property
    def ok(self) -> bool:
        return not self.faults

    def fault(
        self, kind: str, message: str, cid: CID | None = None, layer: str | None = None
    ) -> None:
        self.faults.append(Fault(kind, message, None if cid is None else str(cid), layer))

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        view = None if m is None else m.extra.get(EXTRA_KEY)
        return {
            "manifest": self.manifest_cid,
            "ok": self.ok,
            "faults": [asdict(f) for f in self.faults],
            "notes": list(self.notes),
            "layers": self.layers,
            "blocks_checked": self.blocks_checked,
            "bytes_checked": self.bytes_checked,
            "run": None if m is None else m.run_id,
            "kind": None if m is None else m.kind,
            "epoch": None if m is None else m.epoch,
            "round": None if m is None else m.round,
            "step": None if m is None else m.step,
            "unixfs": None if m is None or view is None else str(view),
        }


def _node(store: BlockChecker, cid: CID, what: str, report: VerifyReport) -> bytes | None:
    try:
        return store.get(cid)
    except BlockNotFoundError:
        report.fault(f"{what}-missing", f"{what} block {cid} is not in the store", cid)
    except CorruptBlockError:
        message = f"{what} block {cid} does not match its CID"
        report.fault(f"{what}-corrupt", message, cid)
    return None


def verify_checkpoint(
    store: BlockChecker,
    manifest_cid: CID,
    *,
    on_total: Callable[[int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check everything about the checkpoint at ``manifest_cid``; never raises for a bad one.

    ``on_total(bytes)`` is called once the manifest is known, ``on_progress(bytes)`` per block.
    """
    report = VerifyReport(str(manifest_cid))
    data = _node(store, manifest_cid, "manifest", report)
    if data is None:
        return report
    errors: list[str] = []
    try:
        root = parse_root(data, errors)
    except ManifestError as exc:
        report.fault("manifest-invalid", f"manifest {manifest_cid}: {exc}", manifest_cid)
        return report

    def bad_page(page: CID, kind: str, layer: str | None, exc: ManifestError) -> None:
        report.fault("page-invalid", f"{kind} page {page}: {exc}", page, layer)

    try:
        walk = walk_manifest(
            root,
            lambda cid, what: _node(store, cid, what, report),
            errors=errors,
            on_bad_page=bad_page,
        )
    except ManifestError as exc:  # the tree breaks MAX_MANIFEST_NODES or MAX_LAYERS
        report.fault("manifest-invalid", f"manifest {manifest_cid}: {exc}", manifest_cid)
        return report
    pages_ok = walk.layer_pages_ok
    partials = [walked.layer for walked in walk.layers]
    for message in errors:
        report.fault("layer-invalid", message)
    jobs = _chunk_jobs(walk, root, report)
    if pages_ok and not errors:
        _check_totals(root, partials, manifest_cid, report)
    report.layers = len(partials)
    report.manifest = root.meta
    if on_total is not None:
        on_total(sum(length for length, _ in jobs.values()))
    _check_blocks(store, jobs, report, on_progress)
    _check_aggregation(store, root.meta, report)
    _check_view(store, manifest_cid, root.meta, report)
    if any(f.kind.endswith("-corrupt") for f in report.faults) and isinstance(store, BlockStore):
        report.notes.append(f"corrupt blocks were moved to {store.root / 'quarantine'}")
    parent = root.meta.parent
    if parent is not None and not store.has(parent):
        report.notes.append(f"parent manifest {parent} is not held (not checked)")
    return report


def _chunk_jobs(
    walk: ManifestWalk, root: RootNode, report: VerifyReport
) -> dict[CID, tuple[int, str]]:
    """Every chunk to check: chunk -> (expected length, first layer or file using it). A
    duplicate layer name, or a layer whose chunk count does not fit its size, is a fault."""
    seen: set[str] = set()
    jobs: dict[CID, tuple[int, str]] = {}
    for walked in walk.layers:
        p = walked.layer
        if p.name in seen:
            report.fault("layer-duplicate", f"duplicate layer name {p.name!r}", layer=p.name)
        seen.add(p.name)
        chunks = walked.chunks
        if len(chunks) != chunk_count(p.nbytes):
            report.fault(
                "layer-invalid",
                f"layer {p.name!r}: {len(chunks)} chunks for {p.nbytes} bytes "
                f"(needs {chunk_count(p.nbytes)})",
                layer=p.name,
            )
            continue
        for index, cid in enumerate(chunks):
            jobs.setdefault(cid, (chunk_length(p.nbytes, index), p.name))
    for name, ref in root.meta.tokenizer_files.items():
        for index, cid in enumerate(ref.chunks):
            jobs.setdefault(cid, (chunk_length(ref.size, index), f"file:{name}"))
    return jobs


def _check_totals(
    root: RootNode, partials: list[PartialLayer], manifest_cid: CID, report: VerifyReport
) -> None:
    """The manifest's layer count and byte total against the layers it lists."""
    if len(partials) != root.layer_count:
        report.fault(
            "manifest-invalid",
            f"manifest says {root.layer_count} layers but lists {len(partials)}",
            manifest_cid,
        )
    total = sum(p.nbytes for p in partials)
    if total != root.total_bytes:
        report.fault(
            "manifest-invalid",
            f"manifest says {root.total_bytes} bytes but layers sum to {total}",
            manifest_cid,
        )


def _check_blocks(
    store: BlockChecker,
    jobs: dict[CID, tuple[int, str]],
    report: VerifyReport,
    on_progress: Callable[[int], None] | None,
) -> None:
    cids = list(jobs)
    with ThreadPoolExecutor(max_workers=VERIFY_WORKERS) as pool:
        for cid, (status, size) in zip(cids, pool.map(store.check, cids), strict=True):
            expected, owner = jobs[cid]
            if status == "missing":
                report.fault("block-missing", f"block {cid} of {owner} is missing", cid, owner)
            elif status == "corrupt":
                report.fault(
                    "block-corrupt",
                    f"block {cid} of {owner} does not match its CID",
                    cid,
                    owner,
                )
            elif size != expected:
                report.fault(
                    "layer-invalid",
                    f"block {cid} of {owner} is {size} bytes, the manifest needs {expected}",
                    cid,
                    owner,
                )
            if status != "missing":
                report.blocks_checked += 1
                report.bytes_checked += size
            if on_progress is not None:
                on_progress(expected)


def _check_view(
    store: BlockChecker, manifest_cid: CID, meta: Manifest, report: VerifyReport
) -> None:
    """The UnixFS view (specs/manifest.md#unixfs-view): recorded CID = rebuilt CID, all held."""
    if EXTRA_KEY not in meta.extra:
        if meta.kind == "checkpoint":
            report.notes.append("no UnixFS view recorded (a manifest from an older cnode)")
        return
    recorded = meta.extra[EXTRA_KEY]
    if not isinstance(recorded, CID) or recorded.codec != DAG_PB:
        report.fault("unixfs-invalid", f"extra.{EXTRA_KEY} must be a dag-pb CID link")
        return
    if report.faults:
        report.notes.append("UnixFS view not checked: the manifest has faults")
        return
    try:
        manifest = resolve(manifest_cid, store.get)
    except (ManifestError, BlockNotFoundError, CorruptBlockError) as exc:
        report.notes.append(f"UnixFS view not checked: {exc}")
        return
    view = build_view(manifest.layers, manifest.model_config, manifest.tokenizer_files)
    if view.root != recorded:
        report.fault(
            "unixfs-mismatch",
            f"manifest records UnixFS directory {recorded}; its layers and files give {view.root}",
            recorded,
        )
        return
    for cid in view.cids():
        status, _ = store.check(cid)
        if status != "ok":
            report.fault(f"unixfs-{status}", f"UnixFS view block {cid} is {status}", cid)
        else:
            report.blocks_checked += 1


def _check_aggregation(store: BlockChecker, meta: Manifest, report: VerifyReport) -> None:
    if meta.aggregation is None:
        return
    absent = 0
    for cid in meta.aggregation.updates:
        status, _ = store.check(cid)
        if status == "missing":
            absent += 1
            continue
        if status == "corrupt":
            message = f"update {cid} does not match its CID"
            report.fault("update-corrupt", message, cid)
            continue
        # A signed update's format (an auth envelope, in cnode's training) is not storage's to
        # judge: here it must be strict DAG-CBOR. `cnode checkpoint verify` checks signatures.
        try:
            _cbor.decode(store.get(cid))
        except (StorageError, CorruptBlockError, BlockNotFoundError) as exc:
            report.fault("update-invalid", f"update {cid}: {exc}", cid)
    if absent:
        report.notes.append(
            f"{absent} of {len(meta.aggregation.updates)} signed updates are not held (not checked)"
        )
