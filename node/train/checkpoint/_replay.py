"""The replay of a checkpoint: recompute it from its parent and the signed records it lists,
and compare every layer's chunk CIDs with the manifest's (specs/training.md#replay).

Each round is re-aggregated as the swarm did it: a full round from its members' updates (scored,
when scores are on), a partitioned round by recomputing every partition from its inputs, with
its agreed scores resolved from the listed score records.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from cnode.aggregation import score_seed
from cnode.storage import (
    CID,
    BlockStore,
    Manifest,
    StorageError,
    load_checkpoint,
)

from .. import limits
from .._config import TrainingConfig
from .._exceptions import CatchUpError, PeerUpdateError, ReplayMismatchError
from .._round import UpdateHeader, aggregate_round, load_update, streams_updates
from .._segmented import SegmentedUpdate
from ..model import (
    State,
    TextData,
    join_momentum,
    layer_chunk_cids,
    split_momentum,
    state_cid,
    uses_momentum,
    zero_momentum,
)
from ..partition import (
    PartitionResult,
    apply_partitions,
    recompute_partition,
    state_numel,
)
from ..scores import (
    RoundScoring,
    ScoreRecord,
    SpreadRecords,
    SpreadScores,
    TargetLosses,
    check_recorded_scores,
    checkpoint_reputation,
    disputed_targets,
    resolve_scores,
)
from ._checkpoint import RoundLog, genesis_state, manifest_meta, read_training_checkpoint
from ._signed import open_signed_record

__all__ = ["ReplayReport", "compare_layers", "replay_checkpoint", "replay_rounds"]

log = structlog.get_logger(__name__)


def _open_records(
    store: BlockStore, headers: Sequence[CID], run: str
) -> tuple[
    dict[int, list[tuple[CID, UpdateHeader]]],
    dict[int, dict[int, tuple[CID, PartitionResult]]],
    dict[int, dict[str, tuple[CID, ScoreRecord]]],
]:
    """The signed records a checkpoint lists, opened and sorted by round: update headers,
    partition results (by partition) and score records (by signer)."""
    by_round: dict[int, list[tuple[CID, UpdateHeader]]] = defaultdict(list)
    partitions: dict[int, dict[int, tuple[CID, PartitionResult]]] = defaultdict(dict)
    score_records: dict[int, dict[str, tuple[CID, ScoreRecord]]] = defaultdict(dict)
    for cid in headers:
        try:
            envelope = store.get(cid)
        except StorageError as exc:
            raise CatchUpError(f"signed update header {cid} is not available: {exc}") from exc
        record = open_signed_record(envelope, run=run)
        if isinstance(record, PartitionResult):
            partitions[record.round][record.partition] = (cid, record)
        elif isinstance(record, ScoreRecord):
            score_records[record.round][record.peer] = (cid, record)
        else:
            by_round[record.round].append((cid, record))
    return by_round, partitions, score_records


def replay_rounds(
    store: BlockStore,
    parent: State,
    *,
    run: str,
    first_round: int,
    headers: Sequence[CID],
    config: TrainingConfig,
    reputation: Mapping[str, int] | None = None,
    recorded: Mapping[int, Mapping[str, Any]] | None = None,
    momentum: State | None = None,
) -> tuple[State, list[RoundLog], State | None]:
    """Re-aggregate the rounds the signed headers describe, starting from ``parent`` (and the
    outer ``momentum`` after it; None: zeros). Returns the state, the rounds and the momentum.

    Every header block and update block must be in ``store``. A header whose ``base`` is not the
    replayed state of the round before is a :class:`ReplayMismatchError`. ``recorded``: the
    checkpoint's params by round (a scored partitioned round's seed input is there).
    """
    by_round, partitions, score_records = _open_records(store, headers, run)
    if not by_round:
        return parent, [], momentum
    rounds = sorted(by_round)
    # A round may be absent: one in which nothing could be exchanged (no partition had a
    # result) left the state as it was and lists nothing (specs/training.md#empty-rounds).
    if rounds[0] < first_round:
        raise ReplayMismatchError(f"update headers cover rounds {rounds}, from {first_round} on")
    if len(rounds) > limits.MAX_REPLAY_ROUNDS:
        raise ReplayMismatchError(f"{len(rounds)} rounds to replay > MAX_REPLAY_ROUNDS")
    state, logs = parent, []
    # Scores and reputations are recomputed too, from the parent's reputation
    scoring = None
    if config.scores:
        scoring = RoundScoring(config, TextData.build(config.data, config.model), reputation)
    for number in rounds:
        if partitions.get(number):
            parent_state = state
            state, entry, momentum = _replay_partitioned(
                store, state, number, partitions[number], config, momentum
            )
            if scoring is not None:  # the agreed scores, from the listed score records
                spread = _replay_spread(
                    store, scoring, parent_state, run, number, by_round[number],
                    score_records[number], (recorded or {}).get(number, {}),
                )  # fmt: skip
                scoring.reputation = dict(spread.reputation)
                params = {**entry.params, "scores": spread.to_params()}
                entry = RoundLog(entry.round, entry.state_cid, entry.headers, params)
            logs.append(entry)
            continue
        state, entry, momentum = _replay_full(
            store, state, number, by_round[number], config, scoring, momentum
        )
        logs.append(entry)
    return state, logs, momentum


def _replay_full(
    store: BlockStore,
    state: State,
    number: int,
    headers: Sequence[tuple[CID, UpdateHeader]],
    config: TrainingConfig,
    scoring: RoundScoring | None,
    momentum: State | None,
) -> tuple[State, RoundLog, State | None]:
    """Re-aggregate full round ``number`` from its members' updates (and score them, with
    ``scoring``); every header must name the replayed parent state as its base."""
    base = state_cid(state)
    updates: dict[str, Mapping[str, torch.Tensor]] = {}
    by_layer = streams_updates(len(headers), state)  # as the round did: the same bits either way
    for _cid, header in sorted(headers, key=lambda item: item[1].peer):
        if header.base != base:
            raise ReplayMismatchError(
                f"round {number}: {header.peer[-8:]}'s update was trained from {header.base}, "
                f"but the replayed parent state is {base}"
            )
        try:
            updates[header.peer] = (SegmentedUpdate if by_layer else load_update)(
                store,
                header.update,
                peer=header.peer,
                codec=config.wire_codec,
                shapes=state,
            )
        except PeerUpdateError as exc:
            raise CatchUpError(f"round {number}: {exc}") from exc
    rule, extra = config, {}
    if scoring is not None:
        scored = scoring.score(number, state, updates, {h.peer: c for c, h in headers})
        updates, rule = scoring.admitted_updates(scored, updates), scoring.rule_config()
        extra = {"scores": scored.to_params()}
    result = aggregate_round(state, updates, rule, momentum, by_layer=by_layer)
    cids = tuple(cid for cid, _ in sorted(headers, key=lambda item: item[1].peer))
    entry = RoundLog(number, result.state_cid, cids, result.aggregation.params | extra)
    log.info("round_replayed", round=number, updates=len(updates), state=str(result.state_cid))
    return result.state, entry, result.momentum


def _replay_spread(
    store: BlockStore,
    scoring: RoundScoring,
    parent: State,
    run: str,
    number: int,
    headers: Sequence[tuple[CID, UpdateHeader]],
    records: Mapping[str, tuple[CID, ScoreRecord]],
    params: Mapping[str, Any],
) -> SpreadScores:
    """The scores a partitioned round agreed, from its score records and the members' header
    CIDs it recorded (every listed header among them), with each disputed target recomputed from
    its update (specs/training.md#scores-in-partitioned-rounds): what every node computed."""
    by_peer = {h.peer: (cid, h) for cid, h in headers}
    cids = {p: cid for p, (cid, _) in by_peer.items()}
    scores = params.get("scores")
    named = scores.get("headers") if isinstance(scores, Mapping) else None
    if isinstance(named, Mapping) and len(named) <= limits.MAX_ROUND_MEMBERS:
        try:
            recorded = {str(p): CID.parse(c) for p, c in named.items()}
        except (StorageError, TypeError) as exc:
            raise ReplayMismatchError(
                f"round {number}: a recorded header CID is bad: {exc}"
            ) from exc
        if any(recorded.get(p) != c for p, c in cids.items()):
            raise ReplayMismatchError(
                f"round {number}: a listed header is not among the recorded members' headers"
            )
        cids = recorded
    seed = score_seed(str(c) for c in cids.values())
    common = SpreadRecords(
        run=run, round_=number, members=sorted(cids), headers=cids,
        base=state_cid(parent), seed=seed, records=records,
    )  # fmt: skip
    recomputed: dict[str, TargetLosses] = {}
    for target in disputed_targets(common):
        if target not in by_peer:
            raise CatchUpError(f"round {number}: the disputed update of {target} is not listed")
        update = load_update(
            store, by_peer[target][1].update, peer=target,
            codec=scoring.config.wire_codec, shapes=parent,
        )  # fmt: skip
        recomputed[target] = TargetLosses(
            cids[target], *scoring.measure(number, seed, parent, target, update)
        )
    return resolve_scores(common, reputation=scoring.reputation, recompute=recomputed.__getitem__)


def _replay_partitioned(
    store: BlockStore,
    state: State,
    number: int,
    results: Mapping[int, tuple[CID, PartitionResult]],
    config: TrainingConfig,
    momentum: State | None,
) -> tuple[State, RoundLog, State | None]:
    """Recompute every partition of round ``number`` from its inputs, then assemble.

    The recomputation, not the signed output, is applied: it is what the swarm applied when a
    verifier caught a wrong result. A wrong result nobody caught makes the replayed state differ
    from the checkpoint's, and the replay fails, naming the layer.
    """
    base = state_cid(state)
    parts = {r.parts for _, r in results.values()}
    if len(parts) != 1:
        raise ReplayMismatchError(f"round {number}: partition results disagree on the count")
    (count,) = parts
    numel = state_numel(state)
    outputs: dict[int, CID | None] = {}
    for partition, (_cid, result) in sorted(results.items()):
        if result.base != base:
            raise ReplayMismatchError(
                f"round {number}: partition {partition} was aggregated on {result.base}, "
                f"but the replayed parent state is {base}"
            )
        try:
            work = recompute_partition(store, result, config=config, numel=numel)
        except PeerUpdateError as exc:
            raise CatchUpError(f"round {number} partition {partition}: {exc}") from exc
        if work.output != result.output:
            log.warning(
                "replay_partition_differs",
                round=number,
                partition=partition,
                signed=str(result.output),
                recomputed=str(work.output),
            )
        outputs[partition] = work.output
    new, momentum = apply_partitions(
        store, state, outputs, parts=count, config=config, momentum=momentum
    )
    cids = tuple(sorted((cid for cid, _ in results.values()), key=str))
    log.info("round_replayed", round=number, partitions=len(results), state=str(state_cid(new)))
    return new, RoundLog(number, state_cid(new), cids, {"parts": count}), momentum


@dataclass(frozen=True)
class ReplayReport:
    """The result of a successful replay."""

    manifest: CID
    parent: CID | None
    rounds: tuple[int, ...]
    updates: int
    layers: int
    state_cid: CID

    def describe(self) -> str:
        """One line for people (``cnode checkpoint verify --replay``)."""
        rounds = f"rounds {self.rounds[0]}..{self.rounds[-1]}" if self.rounds else "no rounds"
        parent = str(self.parent) if self.parent is not None else "the genesis state (seed)"
        return (
            f"replay OK: {rounds} recomputed from {parent} and {self.updates} signed update(s); "
            f"all {self.layers} layers have the manifest's CIDs (state {self.state_cid})"
        )


def replay_checkpoint(store: BlockStore, manifest_cid: CID) -> ReplayReport:
    """Recompute a checkpoint from its parent and signed updates; compare every layer's CIDs.

    Raises:
        ReplayMismatchError: the recomputed state differs; ``.layer`` names the first layer
            (sorted by name) whose chunk CIDs differ.
        CatchUpError: a block the replay needs (parent, header, update) is not in ``store``.
    """
    info = read_training_checkpoint(store, manifest_cid)
    if info.training is None:
        raise ReplayMismatchError(f"checkpoint {manifest_cid} carries no training settings")
    config = info.training
    reputation: dict[str, int] = {}  # the parent's recorded reputations
    momentum: State | None = None  # the parent's outer momentum (None: zeros, or sgd)
    if info.parent is None:
        parent_state, first = genesis_state(config), 1
    else:
        try:
            stored, parent_manifest = load_checkpoint(store, info.parent)
        except StorageError as exc:
            raise CatchUpError(f"parent checkpoint {info.parent} is not available: {exc}") from exc
        parent_state, momentum = split_momentum(stored)
        first = manifest_meta(parent_manifest).round + 1
        reputation = checkpoint_reputation(parent_manifest)
    record = manifest_meta(info.manifest).aggregation
    rows = record.params.get("rounds") if record is not None else None
    recorded = {
        r[0]: r[1]
        for r in (rows if isinstance(rows, list) else [])
        if isinstance(r, list) and len(r) == 2 and isinstance(r[0], int) and isinstance(r[1], dict)
    }
    state, logs, momentum = replay_rounds(
        store,
        parent_state,
        momentum=momentum,
        run=info.run,
        first_round=first,
        headers=info.headers,
        config=config,
        reputation=reputation,
        recorded=recorded,
    )
    if logs and logs[-1].round != info.round:
        raise ReplayMismatchError(
            f"updates end at round {logs[-1].round}, the checkpoint is of round {info.round}"
        )
    if uses_momentum(config) and momentum is None:
        momentum = zero_momentum(state)  # a nesterov run's checkpoints always store one
    compare_layers(info.manifest, join_momentum(state, momentum))
    if config.scores:  # the recorded scores, admissions and reputations, recomputed
        check_recorded_scores(rows, {r.round: r.params for r in logs})
    return ReplayReport(
        manifest_cid,
        info.parent,
        tuple(r.round for r in logs),
        len(info.headers),
        len(state),
        state_cid(state),
    )


def compare_layers(manifest: Manifest, state: State) -> None:
    """Raise ReplayMismatchError naming the first layer whose CIDs differ from ``state``'s."""
    layers = {layer.name: layer for layer in manifest.layers}
    if set(layers) != set(state):
        missing = sorted(set(state) - set(layers))[:3]
        extra = sorted(set(layers) - set(state))[:3]
        raise ReplayMismatchError(
            f"layer sets differ: recomputed-only {missing}, manifest-only {extra}"
        )
    for name in sorted(layers):
        got = layer_chunk_cids(state[name])
        want = list(layers[name].chunks)
        if got != want:
            raise ReplayMismatchError(
                f"layer {name} differs: manifest has {len(want)} chunk(s) starting {want[0]}, "
                f"the replay gives {got[0]}",
                layer=name,
            )
