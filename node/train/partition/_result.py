"""One partition of a partitioned round, without the network: aggregate, sign, recompute, assemble.

A partitioned round (specs/training.md#partitioned-rounds) cuts the flat update into the run's
segments and the segments into ``parts`` partitions (``cnode.aggregation``). The member assigned
partition ``p`` aggregates that partition of every update it could fetch, stores the result as an
update-like manifest holding only the partition's segments, and signs a
:class:`PartitionResult` naming its inputs, what it rejected and why, the output CID and each
peer's record. Every node assembles the new state from the recorded results.

Everything here is a pure function of its inputs and a block store, so the aggregator, a
verifier, the coordinator checking evidence and ``verify --replay`` all run the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from cnode._cbor import decode as decode_cbor
from cnode.aggregation import (
    AggregatorConfig,
    NotEnoughUpdatesError,
    PeerRecord,
    UpdateEncodingError,
    aggregate_partition,
    decode_update_tensor,
    encode_update_tensor,
    partition_segments,
    scored_config,
    segment_ranges,
)
from cnode.auth import EnvelopeError, Identity, open_envelope, seal
from cnode.storage import (
    CID,
    DAG_CBOR,
    BlockStore,
    CheckpointMeta,
    StorageError,
    compute_cid,
    load_layer,
    read_manifest,
    save_checkpoint,
)

from .. import limits
from .._config import TrainingConfig
from .._exceptions import MalformedUpdateError, PeerUpdateError
from .._round import UpdateHeader, load_segments, open_update_header, segment_layer
from ..model import State

__all__ = [
    "PARTITION_RESULT_TYPE",
    "RESULT_LAYOUT",
    "PartitionResult",
    "PartitionWork",
    "aggregate_own_partition",
    "apply_partitions",
    "envelope_type",
    "open_partition_result",
    "partition_result_cid",
    "recompute_partition",
    "seal_partition_result",
    "state_numel",
    "store_wrong_output",
]

log = structlog.get_logger(__name__)

PARTITION_RESULT_TYPE = "cnode/partition-result/v1"
# extra.layout of a partition result manifest: the partition's segments of the aggregate.
RESULT_LAYOUT = "partition/v1"


@dataclass(frozen=True)
class PartitionResult:
    """The signed statement "in round R I aggregated partition P of these updates into OUTPUT"."""

    run: str
    round: int
    partition: int  # 0 <= partition < parts
    parts: int  # the round's partition count
    peer: str  # the aggregator (the signer)
    base: CID  # the round's parent state: the inputs were trained from it
    inputs: dict[str, CID]  # member -> update header CID, every update it read (taken or not)
    rejected: dict[str, str]  # input member -> why its slice is bad bytes (ban evidence)
    missing: dict[str, str]  # member -> why its slice is not in (not fetched, another base)
    output: CID | None  # the result manifest; None when no input was accepted (applies nothing)
    records: dict[str, tuple[float, float | None]]  # accepted member -> (distance, clip weight)
    backup_for: str | None  # the assigned aggregator this backup replaces, or None

    def to_payload(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "round": self.round,
            "partition": self.partition,
            "parts": self.parts,
            "peer": self.peer,
            "base": str(self.base),
            "inputs": {m: str(c) for m, c in sorted(self.inputs.items())},
            "rejected": dict(sorted(self.rejected.items())),
            "missing": dict(sorted(self.missing.items())),
            "output": None if self.output is None else str(self.output),
            "records": {m: [d, c] for m, (d, c) in sorted(self.records.items())},
            "backup_for": self.backup_for,
        }

    @classmethod
    def from_payload(cls, p: Mapping[str, Any], signer: str) -> PartitionResult:
        """Decode; raise :class:`PeerUpdateError` naming what is wrong."""

        def bad(why: str) -> PeerUpdateError:
            return PeerUpdateError(signer, f"partition result: {why}")

        keys = {
            "run", "round", "partition", "parts", "peer", "base", "inputs", "rejected",
            "missing", "output", "records", "backup_for",
        }  # fmt: skip
        if set(p) != keys:
            raise bad(f"fields {sorted(p)} != {sorted(keys)}")
        for key in ("round", "partition", "parts"):
            if not isinstance(p[key], int) or isinstance(p[key], bool):
                raise bad(f"{key} must be an integer")
        if not 0 <= p["partition"] < p["parts"] or p["round"] < 1:
            raise bad(f"partition {p['partition']} of {p['parts']} in round {p['round']}")
        if p["peer"] != signer or not isinstance(p["run"], str):
            raise bad("names another peer than its signer")
        try:
            inputs = {_peer(m, bad): CID.parse(c) for m, c in _map(p, "inputs", bad).items()}
            base = CID.parse(p["base"])
            output = None if p["output"] is None else CID.parse(p["output"])
        except (StorageError, TypeError) as exc:
            raise bad(f"holds a bad CID: {exc}") from exc
        texts = {}
        for key in ("rejected", "missing"):
            texts[key] = {_peer(m, bad): _text(t, bad) for m, t in _map(p, key, bad).items()}
        records: dict[str, tuple[float, float | None]] = {}
        for m, rec in _map(p, "records", bad).items():
            if not (isinstance(rec, list) and len(rec) == 2):
                raise bad(f"record of {m[-8:]} must be [distance, clip weight]")
            d, c = rec
            if not isinstance(d, int | float) or not (c is None or isinstance(c, int | float)):
                raise bad(f"record of {m[-8:]} holds a non-number")
            records[_peer(m, bad)] = (float(d), None if c is None else float(c))
        if not set(records) | set(texts["rejected"]) <= set(inputs):
            raise bad("records and rejections must name inputs")
        backup = p["backup_for"]
        if backup is not None and not isinstance(backup, str):
            raise bad("backup_for must be a peer id or null")
        return cls(
            p["run"], p["round"], p["partition"], p["parts"], signer, base, inputs,
            texts["rejected"], texts["missing"], output, records, backup,
        )  # fmt: skip


def _map(p: Mapping[str, Any], key: str, bad: Any) -> Mapping[str, Any]:
    value = p[key]
    if not isinstance(value, Mapping) or len(value) > limits.MAX_PARTITION_MEMBERS:
        raise bad(f"{key} must be a map of at most MAX_PARTITION_MEMBERS entries")
    return value


def _peer(value: object, bad: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limits.MAX_PEER_ID_CHARS:
        raise bad("a peer id is not a short string")
    return value


def _text(value: object, bad: Any) -> str:
    if not isinstance(value, str) or len(value) > limits.MAX_REASON_CHARS:
        raise bad("a reason is not a string within MAX_REASON_CHARS")
    return value


def envelope_type(envelope: bytes) -> str | None:
    """The payload type an envelope claims (unverified: for choosing how to open it)."""
    try:
        value = decode_cbor(
            bytes(envelope),
            max_size=limits.MAX_PARTITION_RESULT_BYTES,
            max_depth=8,
            max_items=4 * limits.MAX_PARTITION_MEMBERS + 64,
        )
    except ValueError:  # CBORError: not an envelope any reader would open
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def seal_partition_result(identity: Identity, result: PartitionResult) -> bytes:
    """The result as a signed envelope (``cnode/partition-result/v1``)."""
    if result.peer != identity.peer_id_str:
        raise ValueError("a partition result is signed by the aggregator it names")
    return seal(identity, PARTITION_RESULT_TYPE, result.to_payload())


def partition_result_cid(envelope: bytes) -> CID:
    """The CID a signed partition result is stored and referenced under (a DAG-CBOR block)."""
    return compute_cid(envelope, DAG_CBOR)


def open_partition_result(
    envelope: bytes, *, run: str, round_: int | None = None, signer: str | None = None
) -> PartitionResult:
    """Verify a signed result's size, signature, run and round; PeerUpdateError if bad."""
    who = signer or "unknown peer"
    if len(envelope) > limits.MAX_PARTITION_RESULT_BYTES:
        raise PeerUpdateError(who, f"partition result of {len(envelope)} bytes is too large")
    try:
        opened = open_envelope(
            envelope, expected_type=PARTITION_RESULT_TYPE, expected_signer=signer
        )
    except EnvelopeError as exc:
        raise PeerUpdateError(who, f"bad partition result envelope: {exc}") from exc
    result = PartitionResult.from_payload(opened.payload, opened.signer)
    if result.run != run:
        raise PeerUpdateError(opened.signer, f"partition result is for run {result.run!r}")
    if round_ is not None and result.round != round_:
        raise PeerUpdateError(opened.signer, f"partition result is for round {result.round}")
    return result


@dataclass(frozen=True)
class PartitionWork:
    """What aggregating one partition gave: the output manifest and what the header says."""

    output: CID | None
    rejected: dict[str, str]  # bad bytes: ban evidence
    records: dict[str, PeerRecord]
    skipped: dict[str, str]  # trained from another state: left out, not evidence


def aggregate_own_partition(
    store: BlockStore,
    headers: Mapping[str, UpdateHeader],
    *,
    run: str,
    round_: int,
    partition: int,
    parts: int,
    numel: int,
    base: CID,
    config: TrainingConfig,
) -> PartitionWork:
    """Aggregate partition ``partition`` of the updates ``headers`` name; store the output.

    Each input's partition segments must be in ``store``. An input trained from another state
    than ``base``, or whose segments break the layout or the codec, is rejected with the reason
    (the same on every node that recomputes). The output holds, per segment of the partition,
    the aggregate encoded with the run's codec: every node applies the decoded values.
    """
    indices = list(partition_segments(len(segment_ranges(numel)), parts, partition))
    rejected: dict[str, str] = {}
    skipped: dict[str, str] = {}
    slices: dict[str, torch.Tensor] = {}
    for member in sorted(headers):
        header = headers[member]
        if header.base != base:
            skipped[member] = f"trained from state {header.base}, not {base}"
            continue
        try:
            segs = load_segments(
                store,
                header.update,
                peer=member,
                codec=config.wire_codec,
                numel=numel,
                indices=indices,
            )
        except MalformedUpdateError as exc:
            rejected[member] = exc.reason
            continue
        slices[member] = torch.cat([segs[i] for i in indices])
    # With scores the admitted inputs get scored_config() (no distance rejection), as in a full
    # round (specs/aggregation.md "Scores and reputation"); every recomputation passes the same
    # run config, so the aggregator, verifiers, the coordinator and replay agree.
    rule = (
        scored_config()
        if config.scores
        else AggregatorConfig(name=config.aggregator, params=dict(config.aggregator_params))
    )
    try:
        result = aggregate_partition(slices, rule) if slices else None
    except NotEnoughUpdatesError:
        result = None
    records: dict[str, PeerRecord] = {}
    if result is None:
        return PartitionWork(None, rejected, records, skipped)
    for member, rec in result.records.items():
        if rec.rejected is not None:
            rejected[member] = rec.rejected
        else:
            records[member] = rec
    aggregate = result.tensors["partition"].to(torch.float32)
    ranges = segment_ranges(numel)
    encoded: dict[str, torch.Tensor] = {}
    offset = 0
    for i in indices:
        length = ranges[i][1] - ranges[i][0]
        piece = aggregate[offset : offset + length].contiguous()
        encoded[segment_layer(i)] = encode_update_tensor(piece, config.result_codec)
        offset += length
    meta = CheckpointMeta(
        run_id=run,
        kind="update",
        round=round_,
        extra={
            "base": str(base),
            "codec": config.result_codec,
            "layout": RESULT_LAYOUT,
            "partition": partition,
            "parts": parts,
        },
    )
    return PartitionWork(save_checkpoint(store, encoded, meta), rejected, records, skipped)


def load_result_segments(
    store: BlockStore, output: CID, *, numel: int, partition: int, parts: int, codec: str
) -> dict[int, torch.Tensor]:
    """The decoded aggregate segments of a partition result manifest (blocks in ``store``)."""
    manifest = read_manifest(store, output)
    extra = manifest.extra or {}
    if extra.get("layout") != RESULT_LAYOUT or extra.get("partition") != partition:
        raise MalformedUpdateError("unknown", f"{output} is not a result of partition {partition}")
    ranges = segment_ranges(numel)
    indices = list(partition_segments(len(ranges), parts, partition))
    layers = {layer.name: layer for layer in manifest.layers}
    if set(layers) != {segment_layer(i) for i in indices}:
        raise MalformedUpdateError("unknown", f"{output} holds other segments than partition's")
    out = {}
    for i in indices:
        try:
            out[i] = decode_update_tensor(
                load_layer(store, layers[segment_layer(i)]), codec, (ranges[i][1] - ranges[i][0],)
            )
        except UpdateEncodingError as exc:
            raise MalformedUpdateError("unknown", f"{output} segment {i}: {exc}") from exc
    return out


def apply_partitions(
    store: BlockStore,
    parent: State,
    outputs: Mapping[int, CID | None],
    *,
    parts: int,
    config: TrainingConfig,
) -> State:
    """The new state: ``parent`` plus ``outer_lr`` times each partition's decoded aggregate.

    A partition whose output is None (no accepted input, or no result at all) keeps the
    parent's values. One float32 add per element, as in a full-replication round.
    """
    # A new flat vector (the parent is left intact), updated in place and returned as views.
    flat = torch.cat([parent[n].reshape(-1).to(torch.float32) for n in sorted(parent)])
    numel = flat.numel()
    ranges = segment_ranges(numel)
    for partition, output in sorted(outputs.items()):
        if output is None:
            continue
        segments = load_result_segments(
            store,
            output,
            numel=numel,
            partition=partition,
            parts=parts,
            codec=config.result_codec,
        )
        for i, values in segments.items():
            start, stop = ranges[i]
            step = values if config.outer_lr == 1.0 else values * config.outer_lr
            flat[start:stop].add_(step)  # the same float32 add as parent + step, in place
    out: State = {}
    offset = 0
    for name in sorted(parent):
        n = parent[name].numel()
        out[name] = flat[offset : offset + n].view(parent[name].shape)
        offset += n
    return out


def recompute_partition(
    store: BlockStore, result: PartitionResult, *, config: TrainingConfig, numel: int
) -> PartitionWork:
    """Recompute a signed result from the inputs it names (headers and segments in ``store``).

    The verifier's, the coordinator's and the replay's check: equal to ``result.output`` iff
    the aggregator did its work honestly.
    """
    headers = {}
    for member, cid in result.inputs.items():
        try:
            envelope = store.get(cid)
        except StorageError as exc:
            raise PeerUpdateError(result.peer, f"input header {cid} not held: {exc}") from exc
        headers[member] = open_update_header(
            envelope, run=result.run, round_=result.round, signer=member
        )
    return aggregate_own_partition(
        store,
        headers,
        run=result.run,
        round_=result.round,
        partition=result.partition,
        parts=result.parts,
        numel=numel,
        base=result.base,
        config=config,
    )


def state_numel(state: Mapping[str, torch.Tensor]) -> int:
    """How many values the flat update of ``state`` holds."""
    return sum(math.prod(t.shape) for t in state.values())


def input_segments(numel: int, parts: int, partition: int) -> Sequence[int]:
    """The segment indices an aggregator of ``partition`` reads of every update."""
    return partition_segments(len(segment_ranges(numel)), parts, partition)


def store_wrong_output(store: BlockStore, output: CID, codec: str, *, numel: int) -> CID:
    """A result manifest like ``output`` (of a state of ``numel`` values, encoded with the
    result codec ``codec``) with every value negated and tenfold: what the
    ``--attack wrong_partition`` testing aid signs instead of its honest output."""
    manifest = read_manifest(store, output)
    ranges = segment_ranges(numel)
    wrong = {}
    for layer in manifest.layers:
        start, stop = ranges[int(layer.name.rsplit(".", 1)[1])]
        values = decode_update_tensor(load_layer(store, layer), codec, (stop - start,))
        wrong[layer.name] = encode_update_tensor(values * -10.0, codec)
    meta = CheckpointMeta(
        run_id=manifest.run_id, kind="update", round=manifest.round, extra=dict(manifest.extra)
    )
    return save_checkpoint(store, wrong, meta)
