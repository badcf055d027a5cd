"""Fetching a partitioned round's outputs as the agreed round records them (step 4 of
specs/training.md#partitioned-rounds), for ``PartitionedExchange``."""

from __future__ import annotations

import trio

from cnode.node.coordinator import RoundInfo
from cnode.node.p2p import P2PNode, fetch_purpose
from cnode.storage import CID

from .._exceptions import OutputsUnavailableError
from ..partition import PartitionResult
from ._fetch import GaveUp, MemberFetcher, with_retries

__all__ = ["fetch_outputs"]

# Partition outputs fetched at once (each from its aggregator first, then from everyone).
_PARALLEL_OUTPUTS = 4


async def fetch_outputs(
    node: P2PNode,
    fetcher: MemberFetcher,
    me: str,
    agreed: RoundInfo,
    results: dict[int, tuple[CID, PartitionResult]],
) -> tuple[dict[int, CID | None], int]:
    """Each partition's output as ``agreed`` records it (recomputed where the result was
    wrong), fetched, and the verified bytes that took; raises OutputsUnavailableError naming
    one that cannot be had."""
    outputs: dict[int, CID | None] = {}
    everyone = [m for m in agreed.members if m != me]
    for partition in range(agreed.parts):
        entry = agreed.results.get(str(partition))
        if entry is None or partition not in results:
            outputs[partition] = None  # no result, or one that does not open (everywhere)
            continue
        if entry.replaced is not None:
            outputs[partition] = CID.parse(entry.replaced) if entry.replaced else None
        elif entry.header != str(results[partition][0]):
            outputs[partition] = None  # a result other than the one this node opened
        else:
            outputs[partition] = results[partition][1].output
    failures: dict[int, str] = {}
    got = [0]  # verified bytes fetched
    limiter = trio.CapacityLimiter(_PARALLEL_OUTPUTS)

    async def fetch_one(partition: int, output: CID, holders: list[str]) -> None:
        async def attempt(_: int) -> None:
            with fetch_purpose("outputs"):
                got[0] += (await node.fetch(output, holders=holders)).bytes

        async with limiter:
            tried = await with_retries(attempt, refused_by=fetcher.refused_by)
        if isinstance(tried, GaveUp):
            failures[partition] = tried.why

    async with trio.open_nursery() as nursery:
        for partition, output in outputs.items():
            # Not `store.has(output)`: an earlier try (before `checked`) may have stored the
            # root and run out of time before its chunks; assembling then read a chunk that
            # is not there (BlockNotFoundError under load). fetch() walks the whole closure
            # and asks only for what is missing: nothing, when it is all here.
            if output is not None:
                entry = agreed.results[str(partition)]
                holders = [entry.peer, *([entry.by] if entry.by else []), *everyone]
                nursery.start_soon(fetch_one, partition, output, holders)
    if failures:
        partition, why = sorted(failures.items())[0]
        raise OutputsUnavailableError(
            f"round {agreed.round}: the output of partition {partition} (and "
            f"{len(failures) - 1} more) could not be fetched: {why}"
        )
    return outputs, got[0]
