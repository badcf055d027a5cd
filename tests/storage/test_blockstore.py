from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from cnode.storage import (
    DAG_CBOR,
    RAW,
    BlockMismatchError,
    BlockNotFoundError,
    BlockStore,
    CorruptBlockError,
    StorageError,
    compute_cid,
    limits,
    load_checkpoint,
    read_manifest,
    save_checkpoint,
)

from .conftest import meta, small_state, snapshot


def test_put_get_has_size_delete(store: BlockStore) -> None:
    cid = store.put_new(b"hello world", RAW)
    assert str(cid) == "bafkreifzjut3te2nhyekklss27nh3k72ysco7y32koao5eei66wof36n5e"
    assert store.has(cid) and store.size(cid) == 11
    assert store.get(cid) == b"hello world"
    path = store.root / "blocks" / str(cid)[-3:-1] / str(cid)
    assert path.is_file()  # sharded by the next-to-last two characters
    assert list(store.iter_cids()) == [cid]
    store.delete(cid)
    assert not store.has(cid)
    with pytest.raises(BlockNotFoundError, match=str(cid)):
        store.get(cid)
    store.delete(cid)  # absent: no error


def test_put_verifies_first(store: BlockStore) -> None:
    cid = compute_cid(b"right")
    before = snapshot(store)
    with pytest.raises(BlockMismatchError, match=str(cid)):
        store.put(cid, b"wrong")
    assert snapshot(store) == before
    assert not store.has(cid)


def test_corrupt_block_is_quarantined_not_returned(store: BlockStore) -> None:
    cid = store.put_new(b"a" * 1000, RAW)
    other = store.put_new(b"b" * 1000, RAW)
    path = store.root / "blocks" / str(cid)[-3:-1] / str(cid)
    path.write_bytes(b"a" * 999 + b"X")  # bit rot, same length
    with pytest.raises(CorruptBlockError, match=f"{cid}.*quarantined"):
        store.get(cid)
    assert not store.has(cid)
    assert [p.name.split(".")[0] for p in (store.root / "quarantine").iterdir()] == [str(cid)]
    assert store.get(other) == b"b" * 1000  # neighbours unharmed
    # the good bytes can be stored again
    store.put(cid, b"a" * 1000)
    assert store.get(cid) == b"a" * 1000


def test_read_chunks_and_readinto_verify(store: BlockStore) -> None:
    data = os.urandom(200_000)
    cid = store.put_new(data, RAW)
    assert b"".join(store.read_chunks(cid, 65536)) == data
    assert [len(p) for p in store.read_chunks(cid, 65536)] == [65536, 65536, 65536, 3392]
    buf = bytearray(len(data))
    store.readinto(cid, memoryview(buf))
    assert bytes(buf) == data
    path = store.root / "blocks" / str(cid)[-3:-1] / str(cid)
    path.write_bytes(data[:-1] + b"\x00" if data[-1] else data[:-1] + b"\x01")
    with pytest.raises(CorruptBlockError):
        list(store.read_chunks(cid))  # nothing yielded before the check


def test_check_reports_status(store: BlockStore) -> None:
    cid = store.put_new(b"x" * 10, RAW)
    assert store.check(cid) == ("ok", 10)
    assert store.check(compute_cid(b"nope")) == ("missing", 0)
    (store.root / "blocks" / str(cid)[-3:-1] / str(cid)).write_bytes(b"y" * 10)
    assert store.check(cid) == ("corrupt", 10)
    assert not store.has(cid)


def test_concurrent_writers_same_block(store: BlockStore) -> None:
    data = os.urandom(1 << 20)
    cid = compute_cid(data)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(20):
                store.put(cid, data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert store.get(cid) == data
    assert list((store.root / "tmp").iterdir()) == []


_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from cnode.storage import BlockStore, RAW
    store = BlockStore(Path(sys.argv[1]))
    real = os.write
    def slow_write(fd, data):
        n = real(fd, bytes(data)[: len(data) // 2])  # half a block on disk, then hang
        print("half", flush=True)
        time.sleep(60)
        return n
    os.write = slow_write
    store.put_new(b"z" * 100_000, RAW)
    """
)


def test_crash_mid_write_leaves_no_half_block(tmp_path: Path) -> None:
    root = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "half"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    store = BlockStore(root)
    cid = compute_cid(b"z" * 100_000)
    assert not store.has(cid)
    assert list(store.iter_cids()) == []
    store.put_new(b"z" * 100_000, RAW)
    assert store.get(cid) == b"z" * 100_000


def test_pins_and_gc(store: BlockStore) -> None:
    first = save_checkpoint(store, small_state(0), meta())
    second = save_checkpoint(store, small_state(1), meta(round=3, parent=first))
    stray = store.put_new(b"stray", RAW)
    store.pin("latest", second)
    assert store.pins() == {"latest": second}
    removed = store.gc()
    assert removed > 0
    assert not store.has(stray) and not store.has(first)
    assert store.has(second)
    from cnode.storage import load_checkpoint

    tensors, _ = load_checkpoint(store, second)  # everything the pinned one needs survived
    assert set(tensors) == set(small_state(1))
    store.unpin("latest")
    store.gc()
    assert list(store.iter_cids()) == []


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x" * 200])
def test_bad_pin_names(store: BlockStore, name: str) -> None:
    with pytest.raises(StorageError, match="bad pin name"):
        store.pin(name, compute_cid(b"\xa0", DAG_CBOR))


def test_oversize_block_refused(store: BlockStore) -> None:
    from cnode.storage import BlockTooLargeError, limits

    data = bytes(limits.MAX_BLOCK_SIZE + 1)
    before = snapshot(store)
    with pytest.raises(BlockTooLargeError, match="MAX_BLOCK_SIZE"):
        store.put_new(data, RAW)
    cid = compute_cid(data[:-1])
    with pytest.raises(BlockTooLargeError):
        store.put(cid, data)
    assert snapshot(store) == before


def test_stale_temp_files_removed_on_open(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "s")
    old_file = store.root / "tmp" / "x.123.abc"
    old_dir = store.root / "tmp" / "car-import-dead"
    fresh = store.root / "tmp" / "y.456.def"
    old_file.write_bytes(b"half")
    old_dir.mkdir()
    (old_dir / "blk").write_bytes(b"b")
    fresh.write_bytes(b"in progress elsewhere")
    for path in (old_file, old_dir):
        os.utime(path, (0, 0))
    BlockStore(tmp_path / "s")
    assert sorted(p.name for p in (store.root / "tmp").iterdir()) == [fresh.name]


@pytest.mark.parametrize("create", [True, False])
def test_store_under_a_file_is_a_storage_error_naming_it(tmp_path: Path, create: bool) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(StorageError, match=r"cannot open the block store .*file/x.*directory"):
        BlockStore(tmp_path / "file" / "x", create=create)
    with pytest.raises(StorageError, match=r"cannot open the block store .*file.*directory"):
        BlockStore(tmp_path / "file", create=create)


def test_read_only_store_creates_nothing_and_reads_empty(tmp_path: Path) -> None:
    root = tmp_path / "absent" / "blocks"
    store = BlockStore(root, create=False)
    cid = compute_cid(b"hello", RAW)
    assert not store.has(cid)
    assert store.check(cid) == ("missing", 0)
    with pytest.raises(BlockNotFoundError, match=str(cid)):
        store.get(cid)
    assert list(store.iter_cids()) == [] and store.pins() == {}
    assert not (tmp_path / "absent").exists()
    # an existing store opened read-only reads what it holds
    BlockStore(root).put(cid, b"hello")
    assert BlockStore(root, create=False).get(cid) == b"hello"


def test_put_new_all_hashes_ahead_and_stores_what_put_new_would(tmp_path: Path) -> None:
    """The save path's pipelined put (hashing in worker threads, writing in order): the same
    CIDs in the same order as one put_new per chunk, every block readable and verified, already
    held blocks skipped, and a layer over HASH_AHEAD chunks saved to the same manifest CID."""
    rng = random.Random(5)
    chunks = [rng.randbytes(rng.randrange(1, 5000)) for _ in range(3 * limits.HASH_AHEAD)]
    chunks += [chunks[0], b""]  # a repeat and an empty block
    one = BlockStore(tmp_path / "one")
    want = tuple(one.put_new(c, RAW) for c in chunks)
    many = BlockStore(tmp_path / "many")
    assert many.put_new_all([memoryview(c) for c in chunks], RAW) == want
    assert all(many.get(cid) == c for cid, c in zip(want, chunks, strict=True))
    assert many.put_new_all(iter(chunks[:3])) == want[:3]  # held already: nothing rewritten
    assert many.put_new_all([]) == ()
    n = (limits.HASH_AHEAD + 3) * limits.CHUNK_SIZE // 4
    state = {"w": torch.arange(n, dtype=torch.float32)}
    saved = save_checkpoint(many, state, meta())
    (layer,) = read_manifest(many, saved).layers
    raw = state["w"].numpy().tobytes()
    step = limits.CHUNK_SIZE
    assert layer.chunks == tuple(compute_cid(raw[i : i + step]) for i in range(0, len(raw), step))
    assert torch.equal(load_checkpoint(many, saved)[0]["w"], state["w"])
