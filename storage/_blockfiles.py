"""Block files under a store's root: paths, atomic writes, raw reads. Verifies nothing.

The lower of the block store's two layers (``_blockstore.py`` has the layout and the upper one,
:class:`~._blockstore.BlockStore`, which verifies every byte it hands out).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import time
from pathlib import Path

from ._cid import CID
from ._exceptions import StorageError
from ._unsynced import start_writeback

__all__ = ["BlockFiles"]

# Temp files older than this are left-overs of a crashed writer and are removed on open.
_STALE_TMP_S = 3600.0


class BlockFiles:
    """Block files under a root folder: paths, atomic writes, raw reads. Verifies nothing."""

    def __init__(self, root: Path, *, create: bool = True) -> None:
        self.root = Path(root)
        self.blocks = self.root / "blocks"
        self.tmp = self.root / "tmp"
        self.quarantine = self.root / "quarantine"
        self.pins = self.root / "pins"
        self.unsynced = self.root / "unsynced"
        # Shard folders known to exist: a save of thousands of chunks made a mkdir call per
        # block (12 % of a 100M save). Nothing in the store removes a shard folder.
        self._shards: set[str] = set()
        try:
            if not create:  # read-only use: nothing is created; an absent store reads as empty
                try:
                    mode = os.stat(self.root).st_mode
                except FileNotFoundError:
                    return
                if not stat.S_ISDIR(mode):
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
                return
            for folder in (self.blocks, self.tmp, self.quarantine, self.pins):
                folder.mkdir(parents=True, exist_ok=True)
            self._remove_stale_tmp()
        except OSError as exc:
            raise StorageError(
                f"cannot open the block store {self.root}: {exc.strerror or exc}"
            ) from exc

    def _remove_stale_tmp(self) -> None:
        now = time.time()
        for entry in os.scandir(self.tmp):
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat().st_mtime <= _STALE_TMP_S:
                    continue
                if entry.is_dir():  # a CAR import's staging folder
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)

    def path(self, cid: CID) -> Path:
        text = str(cid)
        return self.blocks / text[-3:-1] / text

    def write(self, cid: CID, data: bytes | bytearray | memoryview, *, fsync: bool = True) -> None:
        """Write atomically: temp file, fsync, rename. Same-CID writers race harmlessly.

        ``fsync=False`` (an open UnsyncedBatch covers it): only start the writeback.
        """
        target = self.path(cid)
        self._shard_folder(target)
        tmp = self.tmp / f"{target.name}.{os.getpid()}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        complete = False
        try:
            view = memoryview(data).cast("B")
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
            else:
                start_writeback(fd)
            complete = True
        finally:
            os.close(fd)
            if not complete:  # an error or a cancel mid-write: no half block anywhere
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        os.replace(tmp, target)

    def move_in(self, cid: CID, source: Path) -> None:
        """Rename an already fsynced, verified file into place (CAR import)."""
        target = self.path(cid)
        self._shard_folder(target)
        os.replace(source, target)

    def _shard_folder(self, target: Path) -> None:
        if target.parent.name not in self._shards:
            target.parent.mkdir(exist_ok=True)
            self._shards.add(target.parent.name)
