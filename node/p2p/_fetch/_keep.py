"""Storing one verified block a fetch received, on the loop's thread or in a worker thread.

specs/blocks.md#threads: a thread hop costs more than storing a small block, so a block of at
most INLINE_BLOCK_BYTES in an open batch (no fsync of its own, D2) whose reveal hook does not
parse it (a manifest node may be large to parse) is stored on the event loop's thread; any
other in a worker thread, so the loop never stalls on a large write, an fsync or a parse.
"""

from __future__ import annotations

import trio

from cnode.storage import CID, RAW, BlockStore, UnsyncedBatch, VerifiedBlock

from .. import limits
from ._fetch_types import Reveal


def inline(block: VerifiedBlock, batch: UnsyncedBatch | None, reveal: Reveal | None) -> bool:
    """Whether ``block`` is stored on the loop's thread (see the module's docstring)."""
    return (
        len(block.data) <= limits.INLINE_BLOCK_BYTES
        and batch is not None
        and batch.is_open
        and (reveal is None or block.cid.codec == RAW)
    )


async def keep(
    store: BlockStore, block: VerifiedBlock, batch: UnsyncedBatch | None, reveal: Reveal | None
) -> tuple[list[CID], list[CID]]:
    """Store ``block`` (hashed once on receipt: the store does not hash it again) and return
    what ``reveal`` says it reveals (nodes, leaves)."""

    def store_block() -> tuple[list[CID], list[CID]]:
        store.put_verified(block, batch=batch)
        return ([], []) if reveal is None else reveal(block)

    if inline(block, batch, reveal):
        return store_block()
    return await trio.to_thread.run_sync(store_block)
