"""Checkpoints of a run and their replay.

A checkpoint at round R is a ``kind="checkpoint"`` manifest whose

* ``parent`` is the previous checkpoint's manifest CID (``None`` for the genesis at round 0),
* ``aggregation`` lists the aggregator, its parameters and the CIDs of every signed update
  header of rounds ``parent.round + 1 .. R`` (each header names its round),
* ``extra`` holds ``state_cid`` (see _state.py), the run's ``training`` settings and one row per
  round ``{"round", "state_cid", "loss"}``,
* with ``outer_optimizer = "nesterov"``, the outer momentum after round R as layers named
  ``MOMENTUM_PREFIX + parameter`` beside the state's (not part of the state CID).

Replay (``_replay.py``) loads the parent, re-aggregates each round from the signed updates, and
compares every layer's chunk CIDs with the manifest's. See specs/training.md#replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from cnode.storage import (
    CID,
    AggregationRecord,
    BlockStore,
    CheckpointMeta,
    Manifest,
    read_manifest,
    save_checkpoint,
)

from .._config import TrainingConfig
from .._exceptions import TrainingConfigError
from ..model import (
    State,
    build_model,
    join_momentum,
    model_state,
    state_cid,
    uses_momentum,
)

__all__ = [
    "RoundLog",
    "TrainingCheckpoint",
    "genesis_state",
    "manifest_meta",
    "read_training_checkpoint",
    "store_checkpoint",
]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RoundLog:
    """What one aggregated round left behind, as a checkpoint records it."""

    round: int
    state_cid: CID
    headers: tuple[CID, ...]  # signed update header CIDs the round aggregated (in id order)
    params: Mapping[str, Any] = field(default_factory=dict)  # the aggregator's derived params


@dataclass(frozen=True)
class TrainingCheckpoint:
    """The parts of a checkpoint manifest the training loop uses."""

    cid: CID
    run: str
    round: int
    parent: CID | None
    state_cid: CID | None
    training: TrainingConfig | None
    headers: tuple[CID, ...]
    manifest: Manifest


def genesis_state(config: TrainingConfig) -> State:
    """The run's round-0 state: the model built from the config and seed."""
    return model_state(build_model(config))


def store_checkpoint(
    store: BlockStore,
    state: State,
    *,
    run: str,
    round_: int,
    parent: CID | None,
    config: TrainingConfig,
    rounds: Sequence[RoundLog],
    tokenizer_json: str,
    momentum: State | None = None,
) -> CID:
    """Store ``state`` (and the outer ``momentum`` of a nesterov run) as the checkpoint of
    ``round_`` with its aggregation record."""
    headers = [h for r in rounds for h in r.headers]
    record = None
    if rounds:
        outer: dict[str, Any] = {"outer_lr": config.outer_lr}
        if uses_momentum(config):  # absent: sgd, as in every checkpoint from before
            outer |= {
                "outer_optimizer": config.outer_optimizer,
                "outer_momentum": config.outer_momentum,
            }
        record = AggregationRecord(
            aggregator=config.aggregator,
            params={
                "configured": dict(config.aggregator_params),
                **outer,
                "rounds": [[r.round, dict(r.params)] for r in rounds],
            },
            updates=headers,
        )
    meta = CheckpointMeta(
        run_id=run,
        kind="checkpoint",
        epoch=0,
        round=round_,
        step=round_ * config.local_steps,
        parent=parent,
        model_config=config.model.hf_config(),
        tokenizer_files={"tokenizer.json": tokenizer_json.encode()},
        aggregation=record,
        extra={
            "state_cid": str(state_cid(state)),
            "training": config.to_dict(),
            "rounds": [{"round": r.round, "state_cid": str(r.state_cid)} for r in rounds],
        },
    )
    return save_checkpoint(store, join_momentum(state, momentum), meta)


def manifest_meta(manifest: Manifest) -> Any:
    return getattr(manifest, "meta", manifest)


def read_training_checkpoint(store: BlockStore, cid: CID) -> TrainingCheckpoint:
    """Read a checkpoint manifest (blocks must be local) and the training fields it carries."""
    manifest = read_manifest(store, cid)
    meta = manifest_meta(manifest)
    if meta.kind != "checkpoint":
        raise TrainingConfigError(f"{cid} is a {meta.kind!r} manifest, not a checkpoint")
    extra = dict(meta.extra or {})
    training = None
    if isinstance(extra.get("training"), dict):
        training = TrainingConfig.from_dict(extra["training"])
    state = CID.parse(extra["state_cid"]) if isinstance(extra.get("state_cid"), str) else None
    headers = tuple(meta.aggregation.updates) if meta.aggregation is not None else ()
    return TrainingCheckpoint(
        cid, meta.run_id, meta.round, meta.parent, state, training, headers, manifest
    )
