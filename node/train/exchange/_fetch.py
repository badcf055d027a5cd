"""What a partitioned round fetches of an update: the manifest and one partition's segments.

Shared by the aggregator, the verifier and ``bench/round.py`` (specs/training.md
#partitioned-rounds).
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from cnode.node.p2p import P2PNode
from cnode.storage import CID, DAG_CBOR, missing_blocks, read_manifest

from .._round import segment_layer

__all__ = ["enough_inputs", "fetch_update_segments"]


def enough_inputs(inputs: int, members: int) -> bool:
    """A partition result must read a strict majority of the round's members' updates: then no
    node cut off from the rest can make its own update stand for a partition (the rule of the
    agreed input set, specs/coordinator.md#agreement, applied per partition)."""
    return 2 * inputs > members


async def fetch_update_segments(
    node: P2PNode, update: CID, indices: Sequence[int], holders: Sequence[str]
) -> int:
    """Fetch the manifest nodes of ``update`` and the chunks of its segments ``indices``: only
    what a partition needs, every block verified. Returns the bytes fetched."""
    store = node.store
    fetched = 0

    def missing_nodes() -> list[CID]:
        if not store.has(update):
            return [update]
        return [c for c in missing_blocks(store, update) if c.codec == DAG_CBOR]

    def wanted_chunks() -> list[CID]:
        manifest = read_manifest(store, update)
        names = {segment_layer(i) for i in indices}
        chunks = [c for layer in manifest.layers if layer.name in names for c in layer.chunks]
        return [c for c in chunks if not store.has(c)]

    # The walks read the store: in a worker thread, so the node keeps serving blocks meanwhile.
    for _ in range(4):  # root, layer pages, chunk pages: at most three levels
        nodes = await trio.to_thread.run_sync(missing_nodes)
        if not nodes:
            break
        fetched += (await node.fetch_blocks(nodes, holders=holders)).bytes
    wanted = await trio.to_thread.run_sync(wanted_chunks)
    if wanted:
        fetched += (await node.fetch_blocks(wanted, holders=holders)).bytes
    return fetched
