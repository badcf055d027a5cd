"""The block store on disk. See specs/manifest.md#block-store.

Layout under ``root``::

    blocks/<xy>/<cid>    one file per block; <xy> = the two characters before the CID's last
                         one (flatfs "next-to-last/2" sharding: 1024 shards, evenly filled)
    tmp/                 files being written; renamed into blocks/ only when complete + fsynced
    quarantine/<cid>     blocks that failed verification on read, kept for inspection
    pins/<name>          one pin per file: the root CID text of a manifest kept by gc
    unsynced/<marker>    one per batch of fetched blocks written without a per-block fsync
                         (specs/blocks.md#durability, ``_unsynced``); checked on open if stale

Two layers, as boxo does it: :class:`BlockFiles` (``_blockfiles.py``) reads and writes files and
trusts them; :class:`BlockStore` (the public class) verifies every byte it hands out, so a corrupt
file is reported by CID, moved to ``quarantine/`` and never returned.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import structlog

from . import limits
from ._blockfiles import BlockFiles
from ._cid import CID, RAW, compute_cid, matches, new_hash, verify_block
from ._closure import reachable_blocks
from ._exceptions import (
    BlockNotFoundError,
    CorruptBlockError,
    InvalidCIDError,
    ManifestError,
    StorageError,
)
from ._unsynced import UnsyncedBatch, stale_markers, sync_filesystem
from ._verified import VerifiedBlock
from ._walk import BlockReader

log = structlog.get_logger(__name__)

_PIN_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}$")


class BlockChecker(BlockReader, Protocol):
    """What verify needs: a BlockStore, or the blocks of a CAR file read once."""

    def check(self, cid: CID) -> tuple[str, int]: ...


_local = threading.local()


def _buffer() -> bytearray:
    """A per-thread read buffer of one block, reused across checks."""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(limits.MAX_BLOCK_SIZE + 1)
    return buf


class BlockStore:
    """Content-addressed blocks on disk; every read is verified against the CID.

    Args:
        root: the store's folder (created if absent).
        create: False for read-only use (verify, ls): nothing is created, and an absent store
            reads as an empty one.

    Error handling: a store folder that cannot be created or opened (a file in the way, no
    permission) raises StorageError naming it; reads of an absent block raise BlockNotFoundError;
    a stored block that fails verification is moved to ``quarantine/`` and CorruptBlockError
    (naming the CID) is raised.
    """

    def __init__(self, root: Path, *, create: bool = True) -> None:
        self._files = BlockFiles(Path(root), create=create)
        self.root = self._files.root
        if create:
            self._recover_unsynced()

    # -- durability of fetched blocks (specs/blocks.md#durability) ------------------------

    def begin_unsynced(self) -> UnsyncedBatch:
        """Open a batch: ``put_verified(block, batch=...)`` then skips the per-block fsync.

        The caller MUST end it with ``batch.commit()`` (sync once, drop the marker) or, when it
        cannot wait, ``batch.abandon()`` (the next open of the store checks the batch).
        """
        return self._open_batch(UnsyncedBatch(self._files.unsynced))

    def unsynced_save(self) -> UnsyncedBatch:
        """A batch for blocks made here (``put_new(data, batch=...)``: a checkpoint's chunks),
        opened only when the first of them must be written: saving what is already held costs
        no marker and no sync. Ended like :meth:`begin_unsynced`'s, before anything that names
        its blocks is stored (specs/blocks.md#durability, D5)."""
        return UnsyncedBatch(self._files.unsynced)

    def _open_batch(self, batch: UnsyncedBatch) -> UnsyncedBatch:
        try:
            return batch.open()
        except OSError as exc:
            raise StorageError(f"cannot start a batch in {self.root}: {exc}") from exc

    def _recover_unsynced(self) -> None:
        """Check every block written since a stale marker (a batch a crash cut short)."""
        for marker, since in stale_markers(self._files.unsynced):
            checked = corrupt = 0
            for cid in self._written_since(since):
                checked += 1
                corrupt += self.check(cid)[0] == "corrupt"  # quarantined by check
            sync_filesystem(self.root)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(marker)
            log.warning(
                "unsynced_batch_checked",
                marker=marker.name,
                checked=checked,
                quarantined=corrupt,
                reason="a batch of fetched blocks ended without its sync (crash or kill)",
            )

    def _written_since(self, mtime_ns: int) -> Iterator[CID]:
        for shard in os.scandir(self._files.blocks):
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard.path):
                try:
                    if entry.stat().st_mtime_ns < mtime_ns:
                        continue
                    yield CID.parse(entry.name)
                except (FileNotFoundError, InvalidCIDError):
                    continue

    # -- presence -------------------------------------------------------------------------

    def has(self, cid: CID) -> bool:
        return self._files.path(cid).is_file()

    def size(self, cid: CID) -> int:
        try:
            return self._files.path(cid).stat().st_size
        except FileNotFoundError as exc:
            raise BlockNotFoundError(f"block {cid} is not in the store", cid) from exc

    def iter_cids(self) -> Iterator[CID]:
        """Every CID held (order unspecified); stray files are skipped."""
        if not self._files.blocks.is_dir():
            return  # a store opened with create=False that does not exist yet
        for shard in sorted(os.scandir(self._files.blocks), key=lambda e: e.name):
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard.path):
                try:
                    cid = CID.parse(entry.name)
                except InvalidCIDError:
                    continue
                yield cid

    # -- reads ----------------------------------------------------------------------------

    def _quarantine(self, cid: CID, reason: str) -> CorruptBlockError:
        source = self._files.path(cid)
        target = self._files.quarantine / f"{cid}.{int(time.time())}"
        with contextlib.suppress(FileNotFoundError):
            os.replace(source, target)
        log.warning("block_quarantined", cid=str(cid), reason=reason, path=str(target))
        return CorruptBlockError(f"stored block {cid} is corrupt ({reason}); quarantined", cid)

    def _open(self, cid: CID) -> int:
        try:
            return os.open(self._files.path(cid), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise BlockNotFoundError(f"block {cid} is not in the store", cid) from exc

    def get(self, cid: CID) -> bytes:
        """The block's bytes, verified against ``cid``."""
        fd = self._open(cid)
        try:
            size = os.fstat(fd).st_size
            if size > limits.MAX_BLOCK_SIZE:
                raise self._quarantine(cid, f"{size} bytes exceeds MAX_BLOCK_SIZE")
            with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                data = f.read(size + 1)
        finally:
            os.close(fd)
        if not matches(cid, data):
            raise self._quarantine(cid, "hash mismatch")
        return data

    def readinto(self, cid: CID, buffer: memoryview) -> None:
        """Fill ``buffer`` (exactly the block's length) with the verified block.

        Used to load tensors without an extra copy. A block that fails its hash is quarantined
        (CorruptBlockError); a good block of another length than ``buffer`` means the caller's
        manifest is wrong (ManifestError). On error the buffer's content is undefined.
        """
        fd = self._open(cid)
        try:
            size = os.fstat(fd).st_size
            if size != len(buffer):
                os.close(fd)
                fd = -1
                data = self.get(cid)  # quarantines if the file itself is bad
                raise ManifestError(
                    f"chunk {cid} is {len(data)} bytes, the manifest needs {len(buffer)}"
                )
            with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                got = 0
                while got < size:
                    n = f.readinto(buffer[got:])
                    if not n:
                        break
                    got += n
        finally:
            if fd >= 0:
                os.close(fd)
        if got != size or not matches(cid, buffer):
            raise self._quarantine(cid, "hash mismatch")

    def read_chunks(self, cid: CID, size: int = 65536) -> Iterator[bytes]:
        """Stream the block in pieces of ``size`` bytes.

        The whole block (at most MAX_BLOCK_SIZE) is verified before the first piece is yielded,
        so a consumer never sees bytes of a corrupt block.
        """
        if size <= 0:
            raise ValueError("size must be positive")
        data = memoryview(self.get(cid))
        for start in range(0, len(data), size):
            yield bytes(data[start : start + size])

    def check(self, cid: CID) -> tuple[str, int]:
        """Verify a held block without keeping it: ("ok" | "missing" | "corrupt", size).

        A corrupt block is quarantined. Safe to call from several threads at once (hashing and
        reading release the GIL), which is how verify reaches disk speed.
        """
        try:
            fd = self._open(cid)
        except BlockNotFoundError:
            return "missing", 0
        try:
            actual = os.fstat(fd).st_size
            if actual > limits.MAX_BLOCK_SIZE:
                self._quarantine(cid, f"{actual} bytes exceeds MAX_BLOCK_SIZE")
                return "corrupt", actual
            buf = _buffer()
            digest = new_hash()
            with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    digest.update(memoryview(buf)[:n])
        finally:
            os.close(fd)
        if digest.digest() != cid.digest:
            self._quarantine(cid, "hash mismatch")
            return "corrupt", actual
        return "ok", actual

    # -- writes ---------------------------------------------------------------------------

    def put(self, cid: CID, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``cid`` after verifying it (BlockMismatchError if it differs)."""
        verify_block(cid, data)
        path = self._files.path(cid)
        try:
            if path.stat().st_size == len(data):
                return  # already held (a corrupt copy of the same size is caught on read)
        except FileNotFoundError:
            pass
        self._files.write(cid, data)

    def put_verified(self, block: VerifiedBlock, *, batch: UnsyncedBatch | None = None) -> None:
        """Store a block the block exchange hashed on receipt, without hashing it again.

        Only a :class:`VerifiedBlock` is taken, and only :func:`verify_received` makes one (by
        hashing its bytes): so nothing reaches the disk unhashed. Reads still verify.
        With an open ``batch`` (:meth:`begin_unsynced`) the block is not fsynced on its own:
        the batch's commit makes it durable (specs/blocks.md#durability).
        """
        if type(block) is not VerifiedBlock:
            raise TypeError(f"put_verified takes a VerifiedBlock, not {type(block).__name__}")
        path = self._files.path(block.cid)
        try:
            if path.stat().st_size == len(block.data):
                return
        except FileNotFoundError:
            pass
        self._files.write(block.cid, block.data, fsync=batch is None or not batch.is_open)

    def put_new(
        self,
        data: bytes | bytearray | memoryview,
        codec: int = RAW,
        *,
        batch: UnsyncedBatch | None = None,
    ) -> CID:
        """Compute the CID of ``data``, store it, and return the CID.

        With ``batch`` (:meth:`unsynced_save`, opened here at the first block that must be
        written) the block is not fsynced on its own: the batch's commit makes it durable.
        """
        return self._store_hashed(compute_cid(data, codec), data, batch)

    def put_new_all(
        self,
        chunks: Iterable[bytes | bytearray | memoryview],
        codec: int = RAW,
        *,
        batch: UnsyncedBatch | None = None,
    ) -> tuple[CID, ...]:
        """:meth:`put_new` for each chunk, in order; their CIDs.

        The next chunks (at most HASH_AHEAD) are hashed in HASH_THREADS worker threads while
        this one writes, so a save takes about the longer of hashing and writing, not their sum.
        The caller must not change the chunks' bytes until this returns.
        """
        out: list[CID] = []
        ahead: deque[tuple[bytes | bytearray | memoryview, Future[CID]]] = deque()
        with ThreadPoolExecutor(limits.HASH_THREADS, thread_name_prefix="cnode-hash") as pool:
            for chunk in chunks:
                ahead.append((chunk, pool.submit(compute_cid, chunk, codec)))
                if len(ahead) > limits.HASH_AHEAD:
                    data, cid = ahead.popleft()
                    out.append(self._store_hashed(cid.result(), data, batch))
            while ahead:
                data, cid = ahead.popleft()
                out.append(self._store_hashed(cid.result(), data, batch))
        return tuple(out)

    def _store_hashed(
        self, cid: CID, data: bytes | bytearray | memoryview, batch: UnsyncedBatch | None
    ) -> CID:
        """Store ``data`` under ``cid``, which this store computed from it."""
        path = self._files.path(cid)
        try:
            if path.stat().st_size == len(data):
                return cid
        except FileNotFoundError:
            pass
        if batch is not None and not batch.is_open:
            self._open_batch(batch)
        self._files.write(cid, data, fsync=batch is None)
        return cid

    def delete(self, cid: CID) -> None:
        """Remove the block if held (no error if absent)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._files.path(cid))

    def _adopt(self, cid: CID, source: Path) -> None:
        """Move a verified, fsynced file into place (used by CAR import)."""
        self._files.move_in(cid, source)

    # -- pins and gc ----------------------------------------------------------------------

    @staticmethod
    def _check_pin_name(name: str) -> None:
        if not _PIN_NAME.match(name) or ".." in name:
            raise StorageError(f"bad pin name {name!r}: use letters, digits, '.', '_', '-'")

    def pin(self, name: str, root_cid: CID) -> None:
        """Keep ``root_cid`` (a manifest) and everything it lists through gc, under ``name``."""
        self._check_pin_name(name)
        tmp = self._files.tmp / f"pin.{name}.{secrets.token_hex(6)}"
        tmp.write_text(str(root_cid) + "\n", encoding="ascii")
        os.replace(tmp, self._files.pins / name)

    def unpin(self, name: str) -> None:
        """Drop the pin ``name`` (no error if absent)."""
        self._check_pin_name(name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._files.pins / name)

    def pins(self) -> dict[str, CID]:
        """Pin name -> root CID; unreadable pin files are skipped (and logged)."""
        out: dict[str, CID] = {}
        if not self._files.pins.is_dir():
            return out  # a store opened with create=False that does not exist yet
        for entry in sorted(os.scandir(self._files.pins), key=lambda e: e.name):
            try:
                out[entry.name] = CID.parse(Path(entry.path).read_text(encoding="ascii").strip())
            except (OSError, UnicodeDecodeError, InvalidCIDError) as exc:
                log.warning("pin_unreadable", pin=entry.name, error=str(exc))
        return out

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with open(self.root / "gc.lock", "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def gc(self) -> int:
        """Remove every block not reachable from a pin; return how many were removed.

        Reachable = the pinned manifest's nodes, chunks and tokenizer files (not its parent nor the
        updates its aggregation record names: pin those separately to keep them). Run it while no
        checkpoint is being saved: blocks of a not-yet-pinned checkpoint are unpinned.
        """

        with self._lock():
            live: set[CID] = set()
            for root in self.pins().values():
                live |= reachable_blocks(self, root)
            removed = 0
            for cid in list(self.iter_cids()):
                if cid not in live:
                    self.delete(cid)
                    removed += 1
        log.info("gc_done", removed=removed, kept=len(live))
        return removed
