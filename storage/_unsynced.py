"""Verified blocks written without a per-block fsync, made durable together: see
specs/blocks.md#durability.

A per-block fsync was the largest cost of storing a fetched block (measured: 0.85 ms per 1 MiB
block on an idle disk, 6.4 ms on a shared busy one, against 0.26 ms for the write). Fetched
blocks are verified and can be fetched again, so a fetch trades durability per block for
durability per fetch:

1. :meth:`UnsyncedBatch.open` writes a marker ``unsynced/<pid>.<token>`` and fsyncs it (and its
   folder) *before* the first block is written without fsync; the batch holds an exclusive
   ``flock`` on it while it is open.
2. Blocks are written as always (temp file, then rename: never half a file under ``blocks/``),
   but the temp file only starts its writeback (``sync_file_range``, Linux) instead of waiting
   for it.
3. :meth:`UnsyncedBatch.commit` syncs the file system (``syncfs``) and then removes the marker.

A process killed mid-batch leaves complete files (the page cache survives it). An OS crash or
power loss may leave blocks renamed in place whose data never reached the disk (empty or torn
files): the marker survives it, and the next :class:`BlockStore` that opens the folder hashes
every block file written since the marker (:func:`stale_markers`), quarantines each that does
not match its CID, syncs and removes the marker. A lost block is then simply missing and is
fetched again; no corrupt block is ever read (reads verify too).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

from . import limits
from ._exceptions import StorageError

_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait

_libc = (
    ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
)


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now, without waiting (Linux only).

    Spreads the disk writes over the fetch, so the final :func:`sync_filesystem` is short.
    """
    if _libc is not None:
        _libc.sync_file_range(
            fd, ctypes.c_longlong(0), ctypes.c_longlong(0), _SYNC_FILE_RANGE_WRITE
        )


def sync_filesystem(folder: Path) -> None:
    """Make every write to the file system holding ``folder`` durable (syncfs; else sync)."""
    if _libc is None:
        os.sync()
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {folder}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class UnsyncedBatch:
    """One batch of blocks written without a per-block fsync; see the module docstring.

    Resource handling: holds the marker's file descriptor (and its flock) until :meth:`commit`
    or :meth:`abandon`; a process that dies releases the lock, so its marker is then stale.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.marker = folder / f"{os.getpid()}.{secrets.token_hex(6)}"
        self._fd: int | None = None

    def open(self) -> UnsyncedBatch:
        """Write and fsync the marker (step 1): only then may blocks skip their fsync."""
        self.folder.mkdir(exist_ok=True)
        fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.fsync(fd)
            _fsync_dir(self.folder)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.marker)
            raise
        self._fd = fd
        return self

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def commit(self) -> None:
        """Sync the file system, then remove the marker (step 3). Idempotent.

        Error handling: StorageError when the sync fails (the marker then stays: the next open
        of the store checks the batch).
        """
        if self._fd is None:
            return
        try:
            sync_filesystem(self.folder)
            os.unlink(self.marker)
        except OSError as exc:
            self.abandon()
            raise StorageError(f"cannot make fetched blocks durable: {exc}") from exc
        os.close(self._fd)
        self._fd = None

    def abandon(self) -> None:
        """Release the marker without syncing: the next open of the store checks the batch."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def stale_markers(folder: Path) -> Iterator[tuple[Path, int]]:
    """Markers no live batch holds: (path, the mtime in ns from which blocks need a check).

    A marker whose flock is held belongs to a batch still open (this or another process) and
    is skipped. The caller checks the blocks, syncs, then unlinks the marker.
    """
    if not folder.is_dir():
        return
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a batch still open
            slack_ns = limits.UNSYNCED_MTIME_SLACK_S * 1_000_000_000
            yield Path(entry.path), os.fstat(fd).st_mtime_ns - slack_ns
        finally:
            os.close(fd)
