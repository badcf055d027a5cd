"""The partitioned round on a node's training state (specs/training.md#partitioned-rounds).

:class:`PartitionedRounds` is the part of :class:`~._trainer.NodeTrainer` that a partitioned
round calls: aggregate this node's partition of the updates and sign the result, then assemble
the round's state from every partition's output, with the ban evidence of the combined records
and, when scores are on, of the agreed scores. The full round's part stays in ``_trainer.py``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog

from cnode.aggregation import (
    AggregationResult,
    BanRecommendation,
    PeerRecord,
    RoundEvidence,
    combine_records,
)
from cnode.auth import Identity
from cnode.storage import CID, BlockStore

from ._config import TrainingConfig
from ._exceptions import StateMismatchError
from ._outcome import RoundOutcome
from ._round import RoundResult, UpdateHeader
from .checkpoint import RoundLog
from .model import State, state_cid
from .partition import (
    PartitionResult,
    PartitionTask,
    aggregate_own_partition,
    apply_partitions,
    seal_partition_result,
    state_numel,
    store_wrong_output,
)
from .scores import RoundScoring, SpreadScores

__all__ = ["PartitionedRounds"]

log = structlog.get_logger(__name__)


def _combined_records(
    results: Mapping[int, tuple[CID, PartitionResult]], dropped: dict[str, str]
) -> tuple[dict[str, PeerRecord], set[CID], dict[str, str]]:
    """The members' records combined over the partitions' results, the updates those results
    took as inputs, and each member's update CID; members a result missed go into ``dropped``."""
    per_partition = []
    update_cids: dict[str, str] = {}
    inputs: set[CID] = set()
    for p in sorted(results):
        _, result = results[p]
        records = {m: PeerRecord(m, d, c, None) for m, (d, c) in result.records.items()}
        records.update({m: PeerRecord(m, None, None, why) for m, why in result.rejected.items()})
        per_partition.append(records)
        inputs.update(result.inputs.values())
    combined = combine_records(per_partition)
    for _, result in results.values():
        dropped.update({m: why for m, why in result.missing.items() if m not in combined})
        for m, cid in result.inputs.items():
            update_cids.setdefault(m, str(cid))
    return combined, inputs, update_cids


class PartitionedRounds:
    """A partitioned round's calls on the trainer's state (mixed into ``NodeTrainer``)."""

    # The trainer's state these methods read and advance (set by NodeTrainer.__init__).
    config: TrainingConfig
    run: str
    peer: str
    identity: Identity
    store: BlockStore
    attack_name: str | None
    scoring: RoundScoring | None
    evidence: RoundEvidence
    state: State
    state_cid: CID
    momentum: State | None
    round: int
    since_checkpoint: list[RoundLog]

    def aggregate_partition(
        self,
        round_: int,
        headers: Mapping[str, tuple[CID, UpdateHeader]],
        *,
        partition: int,
        parts: int,
        missing: Mapping[str, str],
        backup_for: str | None = None,
    ) -> tuple[bytes, PartitionResult]:
        """Aggregate this node's partition of the updates ``headers`` name (their partition's
        segments in the store), store the output and sign the result; return both."""
        task = PartitionTask(
            self.run, round_, partition, parts, state_numel(self.state), self.state_cid
        )
        work = aggregate_own_partition(
            self.store, {m: h for m, (_, h) in headers.items()}, task, self.config
        )
        output = work.output
        if self.attack_name == "wrong_partition" and output is not None:
            # Testing aid (`--attack wrong_partition`): sign an output its inputs do not give.
            output = store_wrong_output(
                self.store, output, self.config.result_codec, numel=state_numel(self.state)
            )
        result = PartitionResult(
            self.run,
            round_,
            partition,
            parts,
            self.peer,
            self.state_cid,
            {m: cid for m, (cid, _) in headers.items()},
            work.rejected,
            {**missing, **work.skipped},
            output,
            {m: (float(r.distance or 0.0), r.clip_weight) for m, r in work.records.items()},
            backup_for,
        )
        return seal_partition_result(self.identity, result), result

    def apply_partitions(
        self,
        round_: int,
        results: Mapping[int, tuple[CID, PartitionResult]],
        outputs: Mapping[int, CID | None],
        *,
        parts: int,
        dropped: dict[str, str],
        scores: SpreadScores | None = None,
    ) -> RoundOutcome:
        """Assemble the round's state from the partitions' outputs (blocks in the store).

        ``results``: the recorded, checked result of each partition that has one; ``outputs``:
        what each partition applies (the result's output, or the coordinator's recomputation
        when the result was found wrong). Ban evidence comes from the combined records, and
        with ``scores`` (the round's agreed scores) from reputations and wrong score records.
        """
        began = time.perf_counter()
        if round_ != self.round + 1:
            raise StateMismatchError(
                f"asked to assemble round {round_} on the state of {self.round}"
            )
        new, momentum = apply_partitions(
            self.store, self.state, outputs, parts=parts, config=self.config, momentum=self.momentum
        )
        new_cid = state_cid(new)
        combined, inputs, update_cids = _combined_records(results, dropped)
        members = tuple(sorted(m for m, r in combined.items() if r.rejected is None))
        dropped.update({m: r.rejected or "" for m, r in combined.items() if r.rejected})
        cids = tuple(sorted((cid for cid, _ in results.values()), key=str))
        params: dict[str, Any] = {
            "parts": parts,
            "partitions": len(results),
            "members": len(members),
        }
        empty = not results  # the same verdict on every node: results are the recorded ones
        if empty:
            bans = self.evidence.observe(round_, combined, update_cids=update_cids)
            return self._nothing_applied(round_, parts, combined, dropped, bans, scores, began)
        bans = self._round_bans(round_, combined, update_cids, scores)
        if scores is not None and self.scoring is not None:
            dropped.update({m: why for m, why in scores.left_out.items() if m not in combined})
            params["scores"] = scores.to_params()
            # The manifest lists only what the agreed round decides, never what this node
            # happens to hold (a header fetched here but not there made honest nodes' manifests
            # differ): every score record, and the header of each disputed target (a replay
            # recomputes those). The seed's full input is in params["scores"]["headers"].
            disputed = {str(w.figures.get("target")) for w in scores.wrong}
            inputs.update(c for m, c in scores.headers.items() if m in disputed)
            cids += tuple(sorted(scores.records.values(), key=str))
        cids += tuple(sorted(inputs, key=str))
        self.state, self.state_cid, self.round = new, new_cid, round_
        self.momentum = momentum
        self.since_checkpoint.append(RoundLog(round_, new_cid, cids, params))
        log.info("round_assembled", round=round_, state=str(new_cid), parts=parts)
        nothing = AggregationResult({}, combined, params)
        return RoundOutcome(
            round_,
            RoundResult(new, new_cid, nothing),
            members,
            dropped,
            bans,
            time.perf_counter() - began,
        )

    def _nothing_applied(
        self,
        round_: int,
        parts: int,
        combined: dict[str, PeerRecord],
        dropped: dict[str, str],
        bans: list[BanRecommendation],
        scores: SpreadScores | None,
        began: float,
    ) -> RoundOutcome:
        """No partition result: the state stays the parent's. Nothing is logged for the round
        (a replay has nothing to recompute) and its scores move no reputation (no update was
        applied); a wrong score record is still evidence."""
        if scores is not None:
            bans += list(scores.wrong)
        self.round = round_
        log.warning(
            "round_exchanged_nothing",
            round=round_,
            parts=parts,
            why="no partition has a result: no aggregator, nor any backup, got enough "
            "members' updates by the deadline (are the members' addresses reachable?)",
        )
        return RoundOutcome(
            round_,
            RoundResult(self.state, self.state_cid, AggregationResult({}, combined, {})),
            (),
            dropped,
            bans,
            time.perf_counter() - began,
            empty=True,
        )

    def _round_bans(
        self,
        round_: int,
        combined: dict[str, PeerRecord],
        update_cids: dict[str, str],
        scores: SpreadScores | None,
    ) -> list[BanRecommendation]:
        """The round's ban evidence (the round decision's ``RoundEvidence``): the combined
        records, and with scores the agreed scores, their admission and wrong score records;
        the agreed reputations become this node's."""
        if scores is None or self.scoring is None:
            return self.evidence.observe(round_, combined, update_cids=update_cids)
        self.scoring.reputation = dict(scores.reputation)
        cids = {**update_cids, **{t: str(x.header) for t, x in scores.losses.items()}}
        return list(scores.wrong) + self.evidence.observe(
            round_,
            combined,
            update_cids=cids,
            scores=scores.scores,
            seed=scores.seed,
            decided=scores.decision,
        )
