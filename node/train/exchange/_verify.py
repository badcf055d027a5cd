"""Verification in a partitioned round: recompute partitions chosen by a late seed, report lies.

Once every partition has a recorded result, the seed (sha256 over the recorded result CIDs,
sorted) picks ``training.verify_partitions`` partitions other than this node's own. It fetches
their inputs, recomputes them with the aggregator's own code, and sends the coordinator
self-proving evidence (a CAR) for each that differs; then it reports op ``checked``
(specs/training.md#verification).
"""

from __future__ import annotations

import hashlib

import structlog
import trio

from cnode.aggregation import verification_choice
from cnode.node.coordinator import (
    CoordinatorClient,
    CoordinatorRejected,
    CoordinatorUnavailable,
    RoundInfo,
)
from cnode.node.p2p import FetchError, P2PError, P2PNode, fetch_purpose
from cnode.storage import CID, StorageError

from .._exceptions import PeerUpdateError
from .._round import open_update_header
from .._trainer import NodeTrainer
from ..partition import (
    PartitionResult,
    build_partition_evidence,
    input_segments,
    recompute_partition,
)
from ._fetch import fetch_update_segments

__all__ = ["PartitionVerifier"]

log = structlog.get_logger(__name__)


class PartitionVerifier:
    """Checks other members' partition results for one node."""

    def __init__(self, trainer: NodeTrainer, node: P2PNode, client: CoordinatorClient) -> None:
        self.trainer = trainer
        self.node = node
        self.client = client

    async def check(
        self,
        info: RoundInfo,
        recorded: RoundInfo,
        results: dict[int, tuple[CID, PartitionResult]],
        *,
        numel: int,
    ) -> int:
        """Recompute the seeded partitions, send evidence, report ``checked``; return the
        bytes fetched."""
        me = self.trainer.peer
        if recorded.agreed is not None:
            return 0  # decided without us (we were slow): nothing left to check
        seed = hashlib.sha256(
            "\n".join(sorted(e.header for e in recorded.results.values())).encode()
        ).digest()
        own = [p for p, (_, r) in results.items() if r.peer == me]
        chosen = verification_choice(
            seed, me, info.parts, self.trainer.config.verify_partitions, own
        )
        fetched = 0
        wrong: list[int] = []
        for partition in chosen:
            if partition not in results:
                continue
            cid, result = results[partition]
            try:
                right, got = await self._recompute(info, result, numel)
                fetched += got
            except (FetchError, P2PError, StorageError, PeerUpdateError) as exc:
                log.warning("partition_not_verified", partition=partition, error=str(exc))
                continue
            if right == result.output:
                continue
            log.warning(
                "partition_result_wrong",
                partition=partition,
                aggregator=result.peer[-8:],
                claimed=str(result.output),
                recomputed=str(right),
            )
            if right is not None:
                await self.node.announce_hold(right)
            if await self._report_wrong(info, partition, cid, result.output, numel):
                wrong.append(partition)
        try:
            await self.client.checked(info.round, wrong=wrong)
        except CoordinatorRejected as exc:
            log.info("checked_refused", round=info.round, error=str(exc))
        return fetched

    async def _recompute(
        self, info: RoundInfo, result: PartitionResult, numel: int
    ) -> tuple[CID | None, int]:
        indices = input_segments(numel, result.parts, result.partition)
        everyone = [m for m in info.members if m != self.trainer.peer]
        fetched = 0
        headers = [c for c in result.inputs.values() if not self.node.store.has(c)]
        with fetch_purpose("verify"):
            if headers:
                fetched += (
                    await self.node.fetch_blocks(headers, holders=[result.peer, *everyone])
                ).bytes
            for member, cid in sorted(result.inputs.items()):
                header = open_update_header(
                    self.node.store.get(cid), run=result.run, round_=result.round, signer=member
                )
                holders = [member, result.peer, *everyone]
                fetched += await fetch_update_segments(self.node, header.update, indices, holders)
        work = await trio.to_thread.run_sync(
            lambda: recompute_partition(
                self.node.store, result, config=self.trainer.config, numel=numel
            )
        )
        return work.output, fetched

    async def _report_wrong(
        self, info: RoundInfo, partition: int, header: CID, claimed: CID | None, numel: int
    ) -> bool:
        """Send the evidence; ``claimed`` is the output the signed result names (the
        coordinator checks the request matches the header before it recomputes)."""
        car = await trio.to_thread.run_sync(
            lambda: build_partition_evidence(self.node.store, header, numel=numel)
        )
        try:
            answer = await self.client.partition_evidence(
                info.round,
                partition=partition,
                header=str(header),
                output="" if claimed is None else str(claimed),
                car=car,
            )
        except (CoordinatorRejected, CoordinatorUnavailable) as exc:
            # Refused (the result was right after all) or the check failed: this node goes
            # on; it still reports the partition in `checked`, which the coordinator logs.
            log.warning("partition_evidence_refused", partition=partition, error=str(exc))
            return False
        log.warning("partition_aggregator_banned", partition=partition, answer=answer)
        return True
