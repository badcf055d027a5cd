"""storage/_unsynced.py: fetched blocks fsynced per batch, and what a crash leaves.

specs/blocks.md#durability: a crash may lose verified blocks of an open batch (they are fetched
again) but never leaves a corrupt one that is read. The writer here is a real process, killed
with SIGKILL mid-batch; an OS crash's torn file is simulated by truncating a block the batch
wrote (what ext4 can leave when the data never reached the disk).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from cnode.storage import (
    BlockStore,
    CheckpointMeta,
    compute_cid,
    limits,
    save_checkpoint,
    tensor_layer,
    verify_received,
)

WRITER = """
import os, sys, time
from pathlib import Path
from cnode.storage import BlockStore, compute_cid, verify_received
store = BlockStore(Path(sys.argv[1]))
batch = store.begin_unsynced()
print("open", flush=True)
for i in range(int(sys.argv[2])):
    data = i.to_bytes(4, "big") * 16384
    store.put_verified(verify_received(compute_cid(data), data), batch=batch)
    print(i, flush=True)
if sys.argv[3] == "commit":
    batch.commit()
    print("committed", flush=True)
time.sleep(60)
"""


def _block(i: int) -> bytes:
    return i.to_bytes(4, "big") * 16384


def _writer(root: Path, blocks: int, end: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(blocks), end],
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_line(proc: subprocess.Popen[str], line: str, timeout: float = 30.0) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = proc.stdout.readline().strip()
        if got == line:
            return
        assert got or proc.poll() is None, f"writer ended before {line!r}"
    raise AssertionError(f"no {line!r} within {timeout} s")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(10)


def test_a_batch_skips_the_per_block_fsync_and_commits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlockStore(tmp_path / "store")
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    blocks = [verify_received(compute_cid(_block(i)), _block(i)) for i in range(8)]
    store.put_verified(blocks[0])
    assert len(fsyncs) == 1  # outside a batch: one fsync per block, as before
    batch = store.begin_unsynced()
    fsyncs.clear()
    for block in blocks[1:]:
        store.put_verified(block, batch=batch)
    store.put(compute_cid(b"local"), b"local")  # blocks made here are not re-fetchable: fsync
    assert len(fsyncs) == 1
    assert [p.name for p in (store.root / "unsynced").iterdir()] == [batch.marker.name]
    batch.commit()
    assert list((store.root / "unsynced").iterdir()) == []
    assert all(store.check(b.cid) == ("ok", len(b.data)) for b in blocks)
    store.put_verified(blocks[0], batch=batch)  # a committed batch: back to fsync per block
    batch.commit()  # idempotent


def test_killed_writer_leaves_no_corrupt_block_and_the_store_resumes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    proc = _writer(root, 10_000, "no-commit")
    try:
        _wait_line(proc, "40")
    finally:
        _stop(proc)  # SIGKILL mid-batch: no commit, the marker stays
    assert len(list((root / "unsynced").iterdir())) == 1
    store = BlockStore(root)  # open: the stale marker's blocks are checked, then it goes
    assert list((root / "unsynced").iterdir()) == []
    held = list(store.iter_cids())
    assert len(held) >= 41
    assert all(store.check(cid)[0] == "ok" for cid in held)
    assert list((root / "quarantine").iterdir()) == []
    # resume: the rest of the blocks, in a new batch
    batch = store.begin_unsynced()
    for i in range(100):
        store.put_verified(verify_received(compute_cid(_block(i)), _block(i)), batch=batch)
    batch.commit()
    assert sum(1 for _ in store.iter_cids()) == 100


def test_a_torn_block_of_a_crashed_batch_is_quarantined_and_fetched_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    proc = _writer(root, 10_000, "no-commit")
    try:
        _wait_line(proc, "20")
    finally:
        _stop(proc)
    # What an OS crash can leave: renamed in place, its data never written.
    torn = compute_cid(_block(7))
    path = next((root / "blocks").rglob(str(torn)))
    with open(path, "r+b") as f:
        f.truncate(1000)
    store = BlockStore(root)
    assert not store.has(torn)  # quarantined on open, so a fetch asks for it again
    assert [p.name.split(".")[0] for p in (root / "quarantine").iterdir()] == [str(torn)]
    assert all(store.check(cid)[0] == "ok" for cid in store.iter_cids())


def test_a_committed_batch_leaves_nothing_to_check(tmp_path: Path) -> None:
    root = tmp_path / "store"
    proc = _writer(root, 30, "commit")
    try:
        _wait_line(proc, "committed")
    finally:
        _stop(proc)
    assert list((root / "unsynced").iterdir()) == []
    assert sum(1 for _ in BlockStore(root).iter_cids()) == 30


def test_a_live_batch_of_another_process_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "store"
    proc = _writer(root, 5, "no-commit")
    try:
        _wait_line(proc, "4")
        BlockStore(root)  # e.g. `cnode checkpoint verify` while a fetch runs
        assert len(list((root / "unsynced").iterdir())) == 1  # its marker is still there
    finally:
        _stop(proc)


def test_a_save_of_many_chunks_is_synced_once_before_its_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D5: chunks in one batch; the manifest that names them is stored only once it is synced."""
    store = BlockStore(tmp_path / "store")
    state = {"w": torch.arange(6 * limits.CHUNK_SIZE // 4, dtype=torch.float32)}  # 6 chunks
    chunk_cids = {str(c) for c in tensor_layer("w", state["w"]).chunks}
    fsyncs: list[int] = []
    renames: list[tuple[str, bool]] = []  # (block name, a batch marker present)
    real_fsync, real_replace = os.fsync, os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst).parent.parent.name == "blocks":
            renames.append((Path(dst).name, any((store.root / "unsynced").iterdir())))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", replace)
    cid = save_checkpoint(store, state, CheckpointMeta(run_id="r", kind="update"))
    assert {name for name, _ in renames} == chunk_cids | {str(cid)}
    assert all(marked for name, marked in renames if name in chunk_cids)
    assert renames[-1] == (str(cid), False)  # synced and the marker gone before the root
    assert len(fsyncs) == 3  # marker, its folder, the root: not one per chunk
    assert list((store.root / "unsynced").iterdir()) == []
    renames.clear()
    fsyncs.clear()
    again = save_checkpoint(store, state, CheckpointMeta(run_id="r", kind="update"))
    assert again == cid and renames == [] and fsyncs == []  # all held: no batch, no sync
    small = save_checkpoint(store, {"b": torch.ones(3)}, CheckpointMeta(run_id="r", kind="update"))
    assert len(fsyncs) == 2 and store.has(small)  # a chunk and a root: per-block, no batch
