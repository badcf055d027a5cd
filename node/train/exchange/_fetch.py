"""Fetching from a round's members: the one retry loop every stage uses, and what a partitioned
round fetches of an update (the manifest and one partition's segments; shared by the aggregator,
the verifier and ``bench/round.py``, specs/training.md#partitioned-rounds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import trio

from cnode.node.p2p import FetchError, P2PError, P2PNode
from cnode.storage import CID, DAG_CBOR, StorageError, missing_blocks, read_manifest

from .. import limits
from .._round import segment_layer

__all__ = ["GaveUp", "enough_inputs", "fetch_update_segments", "with_retries"]

T = TypeVar("T")


@dataclass(frozen=True)
class GaveUp:
    """Every attempt of :func:`with_retries` failed; ``why`` is the last one's error."""

    why: str


async def with_retries(
    attempt: Callable[[int], Awaitable[T]],
    *,
    refused_by: set[str],
    failed: Callable[[int, str], None] | None = None,
) -> T | GaveUp:
    """``attempt(i)`` for i in 0..FETCH_ATTEMPTS-1 until one returns, sleeping FETCH_RETRY_S x
    (i + 1) after each failure (a FetchError, P2PError or StorageError); GaveUp after the last.

    ``refused_by`` gathers the holders that refused this node (a ban it has not heard of yet?:
    the round loop reads the signed state when it is not empty). ``failed(i, why)`` runs after
    each failure, before the sleep: when the caller's deadline cancels the sleep, what it
    recorded is the reason.
    """
    why = "no attempt finished"
    for i in range(limits.FETCH_ATTEMPTS):
        try:
            return await attempt(i)
        except FetchError as exc:
            refused_by |= exc.refused_by
            why = str(exc)
        except (P2PError, StorageError) as exc:
            why = str(exc)
        if failed is not None:
            failed(i, why)
        await trio.sleep(limits.FETCH_RETRY_S * (i + 1))
    return GaveUp(why)


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
