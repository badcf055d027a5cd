"""storage/_verified.py: one hash per received block, and no way to put unhashed bytes.

``BlockStore.put_verified`` writes without hashing; it takes only a ``VerifiedBlock``, and the
only maker of one is ``verify_received``, which hashes. Every way around that is refused.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from cnode.storage import (
    RAW,
    BlockMismatchError,
    BlockStore,
    BlockTooLargeError,
    VerifiedBlock,
    compute_cid,
    limits,
    verify_checkpoint,
    verify_received,
)

DATA = b"block bytes " * 100


def test_a_verified_block_is_stored_and_read_back(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "s")
    cid = compute_cid(DATA, RAW)
    block = verify_received(cid, DATA)
    assert block.cid == cid and block.data == DATA
    store.put_verified(block)
    store.put_verified(block)  # already held: nothing written twice
    assert store.get(cid) == DATA


def test_verify_received_hashes_and_refuses_wrong_bytes() -> None:
    cid = compute_cid(DATA, RAW)
    with pytest.raises(BlockMismatchError, match="hash to") as info:
        verify_received(cid, DATA + b"!")
    assert info.value.cid == cid and info.value.computed == compute_cid(DATA + b"!", RAW)
    with pytest.raises(BlockTooLargeError):
        verify_received(cid, b"x" * (limits.MAX_BLOCK_SIZE + 1))
    with pytest.raises(TypeError, match="takes bytes, not bytearray"):
        verify_received(cid, bytearray(DATA))  # type: ignore[arg-type]


def test_a_put_that_skips_the_hash_is_impossible_from_outside(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "s")
    cid = compute_cid(DATA, RAW)
    forged_bytes = b"not the block"
    # The constructor refuses every caller but verify_received.
    with pytest.raises(TypeError, match="only by verify_received"):
        VerifiedBlock(cid, forged_bytes)
    with pytest.raises(TypeError, match="only by verify_received"):
        VerifiedBlock(cid, forged_bytes, _mint=object())
    # A genuine one cannot be changed, copied or unpickled into other bytes.
    block = verify_received(cid, DATA)
    with pytest.raises(AttributeError):
        block._data = forged_bytes  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del block._data
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.copy(block)
    with pytest.raises(TypeError, match="cannot be copied"):
        pickle.dumps(block)
    # Nothing else is taken: not a look-alike, not raw bytes.

    class LookAlike:
        def __init__(self) -> None:
            self.cid, self.data = cid, forged_bytes

    for fake in (LookAlike(), (cid, forged_bytes), forged_bytes):
        with pytest.raises(TypeError, match="takes a VerifiedBlock"):
            store.put_verified(fake)  # type: ignore[arg-type]
    assert not store.has(cid)


def test_verify_still_checks_what_put_verified_wrote(tmp_path: Path) -> None:
    import torch

    from cnode.storage import CheckpointMeta, manifest_closure, save_checkpoint

    src = BlockStore(tmp_path / "src")
    root = save_checkpoint(src, {"w": torch.arange(10.0)}, CheckpointMeta(run_id="r"))
    dst = BlockStore(tmp_path / "dst")
    for c in manifest_closure(src, root):
        dst.put_verified(verify_received(c, src.get(c)))
    assert verify_checkpoint(dst, root).ok
    chunk = next(c for c in manifest_closure(src, root) if c.codec == RAW)
    dst._files.path(chunk).write_bytes(b"\0" * dst.size(chunk))  # rot on disk
    assert not verify_checkpoint(dst, root).ok
