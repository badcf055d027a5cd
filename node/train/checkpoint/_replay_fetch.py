"""Fetch from peers what a replay of a checkpoint needs (``cnode checkpoint verify --replay``).

A replay recomputes a checkpoint from its parent and the signed updates its aggregation record
names (_checkpoint.replay_checkpoint). A verifier that took no part in the run holds none of
that: this module fetches, over the block exchange and verified against their CIDs, the
checkpoint itself, its parent checkpoint, every signed update header, and every update those
headers name. See specs/training.md#replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import trio

from cnode.node.p2p import FetchReport, P2PNode
from cnode.storage import CID, StorageError

from .._exceptions import CatchUpError, PeerUpdateError
from .._round import UpdateHeader
from ._checkpoint import read_training_checkpoint
from ._signed import open_signed_record

__all__ = ["ReplayInputs", "fetch_replay_inputs"]

# Update manifests fetched at once (each fetch spreads its blocks over every holder anyway).
_PARALLEL_UPDATES = 4


@dataclass(frozen=True)
class ReplayInputs:
    """What :func:`fetch_replay_inputs` fetched (blocks already held are not counted)."""

    blocks: int
    bytes: int
    updates: int  # signed update headers the checkpoint names
    parent: CID | None


async def fetch_replay_inputs(node: P2PNode, manifest: CID, holders: Sequence[str]) -> ReplayInputs:
    """Fetch the checkpoint ``manifest``, its parent, its signed headers and their updates.

    Error handling: FetchError (from the node) when a block cannot be had from any holder;
    CatchUpError when a fetched header is not a valid signed update header of the run. Every
    block stored until then stays stored (a second call resumes).
    """
    reports: list[FetchReport] = [await node.fetch(manifest, holders)]
    try:
        info = await trio.to_thread.run_sync(read_training_checkpoint, node.store, manifest)
    except StorageError as exc:
        raise CatchUpError(f"{manifest} is not a readable checkpoint: {exc}") from exc
    if info.parent is not None:
        reports.append(await node.fetch(info.parent, holders))
    updates: list[CID] = []
    if info.headers:
        reports.append(await node.fetch_blocks(info.headers, holders))
        for cid in info.headers:
            try:
                record = open_signed_record(node.store.get(cid), run=info.run)
            except PeerUpdateError as exc:
                raise CatchUpError(f"signed update header {cid}: {exc}") from exc
            if isinstance(record, UpdateHeader):  # partition results name their inputs' headers
                updates.append(record.update)
    limiter = trio.CapacityLimiter(_PARALLEL_UPDATES)

    async def fetch_update(update: CID) -> None:
        async with limiter:
            reports.append(await node.fetch(update, holders))

    async with trio.open_nursery() as nursery:
        for update in dict.fromkeys(updates):
            nursery.start_soon(fetch_update, update)
    return ReplayInputs(
        blocks=sum(r.blocks for r in reports),
        bytes=sum(r.bytes for r in reports),
        updates=len(info.headers),
        parent=info.parent,
    )
