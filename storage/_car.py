"""CAR v1 export and import (https://ipld.io/specs/transport/car/carv1/), specs/manifest.md#car.

Layout: varint(len) + DAG-CBOR header ``{"roots": [manifest CID], "version": 1}``, then sections
of varint(len) + binary CID + block bytes. cnode writes exactly one root (the manifest) and the
blocks in fetch order (root, layer pages, chunk pages and chunks per layer, side files).

Import verifies every block before anything reaches the store: blocks are staged under the
store's ``tmp/``, the manifest is decoded and checked complete against staged + held blocks, and
only then are the staged files renamed into place. A bad CAR leaves the store unchanged.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import structlog

from . import _cbor, limits
from ._blockstore import BlockStore
from ._checkpoint import read_manifest
from ._cid import (
    CID,
    DAG_CBOR,
    DAG_PB,
    MAX_VARINT_LEN,
    VarintError,
    decode_cid_prefix,
    matches,
    read_varint,
    varint,
)
from ._closure import manifest_closure
from ._exceptions import (
    BlockNotFoundError,
    CARError,
    CorruptBlockError,
    InvalidCIDError,
    ManifestError,
    StorageError,
)
from ._verify import VerifyReport, verify_checkpoint

log = structlog.get_logger(__name__)


def _read_varint(f: BinaryIO, what: str) -> int | None:
    """Read a minimal varint (``_cid.read_varint``); None at a clean end of file."""
    head = bytearray()
    while len(head) < MAX_VARINT_LEN and (not head or head[-1] & 0x80):
        b = f.read(1)
        if not b:
            if not head:
                return None
            raise CARError(f"truncated CAR: file ends inside the length of {what}")
        head += b
    try:
        return read_varint(head, 0)[0]
    except VarintError as exc:
        raise CARError(f"malformed CAR: length of {what}: {exc}") from None


def _read_exact(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CARError(f"truncated CAR: {what} needs {n} bytes, file has {len(data)}")
    return data


def read_header(f: BinaryIO) -> CID:
    """Read a CAR v1 header; return its single root. CARError if malformed."""
    size = _read_varint(f, "the header")
    if size is None:
        raise CARError("not a CAR file: it is empty")
    if not 0 < size <= limits.MAX_CAR_HEADER_SIZE:
        raise CARError(f"CAR header of {size} bytes exceeds MAX_CAR_HEADER_SIZE or is empty")
    raw = _read_exact(f, size, "the header")
    try:
        header = _cbor.decode(raw)
    except StorageError as exc:
        links = _cbor.foreign_links(raw) or []
        if links and all(codec == "dag-pb" for _cid, codec in links):
            raise CARError(
                f"the CAR's root {links[0][0]} is dag-pb (a UnixFS file or folder), not a cnode "
                "manifest: cnode imports checkpoint CARs, whose root is a DAG-CBOR manifest"
            ) from exc
        raise CARError(f"malformed CAR header: {exc}") from exc
    if not isinstance(header, dict) or set(header) != {"roots", "version"}:
        raise CARError("malformed CAR header: need exactly 'roots' and 'version'")
    if header["version"] != 1:
        raise CARError(f"CAR version {header['version']!r} is not supported (only 1)")
    roots = header["roots"]
    if not isinstance(roots, list) or len(roots) != limits.MAX_CAR_ROOTS:
        raise CARError("a cnode CAR must have exactly one root (the manifest)")
    root = roots[0]
    if isinstance(root, CID) and root.codec == DAG_PB:
        raise CARError(
            f"the CAR's root {root} is dag-pb (a UnixFS file or folder), not a cnode manifest: "
            "cnode imports checkpoint CARs, whose root is a DAG-CBOR manifest"
        )
    if not isinstance(root, CID) or root.codec != DAG_CBOR:
        raise CARError("CAR root must be the DAG-CBOR CID of a manifest")
    return root


def iter_sections(f: BinaryIO) -> Iterator[tuple[CID, bytes]]:
    """Yield (CID, bytes) of each section, unverified. CARError on truncation or bad CIDs."""
    index = 0
    while True:
        size = _read_varint(f, f"section {index}")
        if size is None:
            return
        if not 0 < size <= limits.MAX_CAR_SECTION_SIZE:
            raise CARError(f"CAR section {index} of {size} bytes exceeds MAX_CAR_SECTION_SIZE")
        section = _read_exact(f, size, f"section {index}")
        try:
            cid, used = decode_cid_prefix(section)
        except InvalidCIDError as exc:
            raise CARError(f"CAR section {index}: {exc}") from exc
        yield cid, section[used:]
        index += 1


def export_car(
    store: BlockStore,
    manifest_cid: CID,
    out: Path,
    *,
    structure_only: bool = False,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Write the checkpoint as a CAR v1 file (atomically); return the number of blocks.

    ``structure_only``: only the manifest's DAG-CBOR nodes (root and pages), no data chunks:
    what a Hugging Face folder carries so its bytes can be checked against the manifest CID.
    """
    read_manifest(store, manifest_cid)  # decodes under the limits, all nodes present
    closure = manifest_closure(store, manifest_cid)
    missing = [cid for cid in closure if not store.has(cid)]
    if missing:
        raise CARError(
            f"cannot export {manifest_cid}: {len(missing)} blocks missing, e.g. {missing[0]}"
        )
    if structure_only:
        closure = [cid for cid in closure if cid.codec == DAG_CBOR]
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
    try:
        _write_car(store, manifest_cid, closure, tmp, on_progress)
        os.replace(tmp, out)
    except OSError as exc:  # no folder, no permission, disk full: name the path
        raise CARError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    log.info("car_exported", manifest=str(manifest_cid), path=str(out), blocks=len(closure))
    return len(closure)


def _write_car(
    store: BlockStore,
    manifest_cid: CID,
    closure: list[CID],
    tmp: Path,
    on_progress: Callable[[int], None] | None,
) -> None:
    """Write header and every block of ``closure`` to ``tmp``, fsynced."""
    with open(tmp, "wb") as f:
        header = _cbor.encode({"roots": [manifest_cid], "version": 1})
        f.write(varint(len(header)) + header)
        for cid in closure:
            data = store.get(cid)
            cid_bytes = bytes(cid)
            f.write(varint(len(cid_bytes) + len(data)) + cid_bytes)
            f.write(data)
            if on_progress is not None:
                on_progress(len(data))
        f.flush()
        os.fsync(f.fileno())


class _Staged:
    """Blocks verified from a CAR, kept as fsynced files until the import commits."""

    def __init__(self, folder: Path, store: BlockStore) -> None:
        self.folder = folder
        self.store = store
        self.cids: set[CID] = set()

    def add(self, cid: CID, data: bytes) -> None:
        if cid in self.cids:
            return
        path = self.folder / str(cid)
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.cids.add(cid)

    # BlockReader: staged first, then the store
    def has(self, cid: CID) -> bool:
        return cid in self.cids or self.store.has(cid)

    def get(self, cid: CID) -> bytes:
        if cid in self.cids:
            return (self.folder / str(cid)).read_bytes()  # verified when staged
        return self.store.get(cid)


def import_car(
    store: BlockStore,
    path: Path,
    *,
    pin: bool = True,
    on_progress: Callable[[int], None] | None = None,
) -> CID:
    """Import a CAR v1 checkpoint atomically; return its manifest CID (pinned by that name).

    Raises CARError (truncated, malformed, root absent, incomplete, a block not matching its
    CID) or ManifestError; in every such case the store is unchanged.
    """
    path = Path(path)
    staging = store.root / "tmp" / f"car-import-{secrets.token_hex(6)}"
    staging.mkdir()
    try:
        staged = _Staged(staging, store)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below, after the loop
        except OSError as exc:
            raise CARError(f"cannot read {path}: {exc.strerror}") from exc
        with f:
            root = read_header(f)
            for cid, data in iter_sections(f):
                if len(data) > limits.MAX_BLOCK_SIZE:
                    raise CARError(f"{path.name}: block {cid} exceeds MAX_BLOCK_SIZE")
                if not matches(cid, data):
                    raise CARError(f"{path.name}: block {cid} does not match its CID")
                staged.add(cid, data)
                if on_progress is not None:
                    on_progress(len(data))
        if root not in staged.cids:
            raise CARError(f"{path.name}: its root {root} is not in the CAR")
        try:
            read_manifest(staged, root)
            closure = manifest_closure(staged, root)
        except (ManifestError, BlockNotFoundError, CorruptBlockError) as exc:
            raise CARError(f"{path.name}: manifest {root}: {exc}") from exc
        missing = [cid for cid in closure if not staged.has(cid)]
        if missing:
            raise CARError(
                f"{path.name}: incomplete CAR, {len(missing)} blocks missing, e.g. {missing[0]}"
            )
        for cid in closure:
            if cid in staged.cids:
                store._adopt(cid, staging / str(cid))
        if pin:
            store.pin(str(root), root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("car_imported", manifest=str(root), path=str(path), blocks=len(closure))
    return root


class _CarView:
    """A CAR read once for verify: DAG-CBOR nodes kept, raw blocks only hashed and sized."""

    def __init__(self) -> None:
        self.nodes: dict[CID, bytes] = {}
        self.sizes: dict[CID, int] = {}
        self.bad: set[CID] = set()

    def add(self, cid: CID, data: bytes) -> None:
        if not matches(cid, data):
            self.bad.add(cid)
            return
        self.sizes[cid] = len(data)
        if cid.codec == DAG_CBOR:
            self.nodes[cid] = data

    def has(self, cid: CID) -> bool:
        return cid in self.sizes

    def get(self, cid: CID) -> bytes:
        if cid in self.bad:
            raise CorruptBlockError(f"block {cid} in the CAR does not match its CID", cid)
        if cid not in self.nodes:
            raise BlockNotFoundError(f"block {cid} is not in the CAR", cid)
        return self.nodes[cid]

    def check(self, cid: CID) -> tuple[str, int]:
        if cid in self.bad:
            return "corrupt", 0
        if cid in self.sizes:
            return "ok", self.sizes[cid]
        return "missing", 0


def verify_car(
    path: Path,
    *,
    on_total: Callable[[int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify a CAR file without importing it: every block and the checkpoint it holds.

    One pass over the file hashes every block (progress counts file bytes); then the manifest
    checks run against what the CAR held. Nothing is written anywhere.
    """
    path = Path(path)
    view = _CarView()
    pre: list[tuple[str, str, CID | None]] = []
    root: CID | None = None
    try:
        with open(path, "rb") as f:
            if on_total is not None:
                on_total(os.fstat(f.fileno()).st_size)
            root = read_header(f)
            for cid, data in iter_sections(f):
                if len(data) > limits.MAX_BLOCK_SIZE:
                    pre.append(("block-oversize", f"block {cid} exceeds MAX_BLOCK_SIZE", cid))
                else:
                    view.add(cid, data)
                if on_progress is not None:
                    on_progress(len(data) + len(bytes(cid)) + 2)
    except CARError as exc:
        pre.append(("car-invalid", str(exc), None))
    except OSError as exc:
        pre.append(("car-invalid", f"cannot read {path}: {exc.strerror}", None))
    if root is None:
        report = VerifyReport(str(path))
    else:
        if not view.has(root) and root not in view.bad:
            pre.append(("car-invalid", f"the CAR's root {root} is not in the CAR", root))
        report = verify_checkpoint(view, root)
    for kind, message, where in pre:
        report.fault(kind, message, where)
    return report
