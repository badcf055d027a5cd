"""One round, without the network: store an update, sign its header, check others', aggregate.

Everything here is a pure function of its inputs and a block store, so the same code serves the
live loop, a late joiner replaying rounds, and ``cnode checkpoint verify --replay``.
See specs/training.md#a-round.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from cnode.aggregation import (
    AggregationResult,
    AggregatorConfig,
    TensorSpec,
    UpdateEncodingError,
    aggregate,
    decode_update_tensor,
    encode_update_tensor,
    flat_segments,
    segment_ranges,
    unflatten_segments,
)
from cnode.storage import (
    CID,
    BlockStore,
    CheckpointMeta,
    Manifest,
    StorageError,
    load_layer,
    read_manifest,
    save_checkpoint,
)

from . import limits
from ._config import TrainingConfig
from ._exceptions import MalformedUpdateError, PeerUpdateError
from ._records import RecordKind, record_cid
from .model import State, outer_step, state_cid, uses_momentum, zero_momentum

__all__ = [
    "UPDATE_HEADER_TYPE",
    "UPDATE_LAYOUT",
    "RoundResult",
    "UpdateHeader",
    "aggregate_round",
    "encode_update",
    "expected_specs",
    "header_cid",
    "load_segments",
    "load_update",
    "open_update_header",
    "seal_update_header",
    "segment_layer",
    "store_update",
    "streams_updates",
    "update_manifest",
]

log = structlog.get_logger(__name__)

UPDATE_HEADER_TYPE = "cnode/update-header/v1"
# How an update manifest lays out its values (specs/training.md#update-layout): the flat update
# cut into segments, one layer each. Recorded in the manifest's ``extra.layout``.
UPDATE_LAYOUT = "segments/v1"


@dataclass(frozen=True)
class UpdateHeader:
    """The signed statement "in round R of run X, I trained on N samples; here is my update"."""

    run: str  # run id
    round: int  # the round the update belongs to (>= 1)
    peer: str  # the signer's peer id; must equal the envelope's signer
    samples: int  # sequences trained on (recorded; not used as a weight, it cannot be checked)
    update: CID  # manifest CID of the update (kind "update"), fetched over the block exchange
    base: CID  # state CID the update was trained from; must equal the round's parent state

    def to_payload(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "round": self.round,
            "peer": self.peer,
            "samples": self.samples,
            "update": str(self.update),
            "base": str(self.base),
        }

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], signer: str) -> UpdateHeader:
        """Decode; raise :class:`PeerUpdateError` naming what is wrong."""
        want = {"run": str, "round": int, "peer": str, "samples": int, "update": str, "base": str}
        if set(payload) != set(want):
            raise PeerUpdateError(signer, f"header fields {sorted(payload)} != {sorted(want)}")
        for key, typ in want.items():
            value = payload[key]
            if not isinstance(value, typ) or isinstance(value, bool):
                raise PeerUpdateError(signer, f"header field {key} has type {type(value).__name__}")
        if payload["peer"] != signer:
            raise PeerUpdateError(signer, "header names another peer than its signer")
        if payload["round"] < 1 or payload["samples"] < 0:
            raise PeerUpdateError(signer, "header round must be >= 1 and samples >= 0")
        try:
            update, base = CID.parse(payload["update"]), CID.parse(payload["base"])
        except StorageError as exc:
            raise PeerUpdateError(signer, f"header holds a bad CID: {exc}") from exc
        return cls(
            payload["run"], payload["round"], payload["peer"], payload["samples"], update, base
        )


UPDATE_HEADERS = RecordKind(
    UPDATE_HEADER_TYPE,
    "header",
    "peer",
    limits.MAX_UPDATE_HEADER_BYTES,
    "MAX_UPDATE_HEADER_BYTES",
    UpdateHeader.from_payload,
)
# The header as a signed envelope (``cnode/update-header/v1``); its CID; its checks on opening.
seal_update_header = UPDATE_HEADERS.seal
header_cid = record_cid
open_update_header = UPDATE_HEADERS.open


def segment_layer(index: int) -> str:
    """The manifest layer name of segment ``index`` of an update (``segment.007``)."""
    return f"segment.{index:03d}"


def encode_update(delta: State, codec: str) -> tuple[list[torch.Tensor], State]:
    """``delta`` as encoded segments (what is stored) and what every receiver decodes from it.

    The delta is read as one flat float32 vector (sorted names, row-major) cut into the run's
    segments (``cnode.aggregation.segment_ranges``); each segment is encoded on its own, so a
    partition of the update is a set of layers anyone can fetch and decode apart. The difference
    ``delta - decoded`` is the sender's quantization residual (specs/training.md#error-feedback).
    """
    segments = flat_segments({n: t.to(torch.float32) for n, t in delta.items()})
    encoded = [encode_update_tensor(seg, codec) for seg in segments]
    decoded = [
        decode_update_tensor(e, codec, (seg.numel(),))
        for e, seg in zip(encoded, segments, strict=True)
    ]
    shapes = {name: tuple(t.shape) for name, t in delta.items()}
    return encoded, unflatten_segments(decoded, shapes)


def store_update(
    store: BlockStore,
    encoded: Sequence[torch.Tensor],
    *,
    run: str,
    round_: int,
    base: CID,
    codec: str = "f32",
) -> CID:
    """Store encoded segments as an update manifest (``kind="update"``); return its CID.

    Layer ``segment.NNN`` holds segment NNN as :func:`encode_update` made it with ``codec``;
    ``extra`` records the base state, the codec and the layout, so the update manifest CID that
    the signed header names covers the compressed bytes and how to read them.
    """
    meta = CheckpointMeta(
        run_id=run,
        kind="update",
        epoch=0,
        round=round_,
        step=0,
        parent=None,
        model_config=None,
        tokenizer_files=None,
        aggregation=None,
        extra={"base": str(base), "codec": codec, "layout": UPDATE_LAYOUT},
    )
    return save_checkpoint(store, _SegmentLayers(encoded), meta)


class _SegmentLayers(Mapping[str, torch.Tensor]):
    """``segment.NNN`` -> ``encoded[NNN]``, looked up when save_checkpoint reads the layer (once
    to check it, once to write it): a sequence that encodes on lookup is stored holding one
    segment at a time, not the whole encoded update (bench/scale.py's synthetic peers at 1B)."""

    def __init__(self, encoded: Sequence[torch.Tensor]) -> None:
        self.encoded = encoded

    def __getitem__(self, name: str) -> torch.Tensor:
        index = name.removeprefix("segment.")
        if not index.isdigit() or name != segment_layer(int(index)):
            raise KeyError(name)
        if int(index) >= len(self.encoded):
            raise KeyError(name)
        return self.encoded[int(index)]

    def __iter__(self) -> Iterator[str]:
        return (segment_layer(i) for i in range(len(self.encoded)))

    def __len__(self) -> int:
        return len(self.encoded)


def update_manifest(store: BlockStore, cid: CID, peer: str, codec: str) -> Manifest:
    """The update manifest at ``cid``, checked to be an update of ``codec`` and our layout."""
    try:
        manifest = read_manifest(store, cid)
    except StorageError as exc:
        raise PeerUpdateError(peer, f"update {cid} unreadable: {exc}") from exc
    if manifest.kind != "update":
        raise PeerUpdateError(peer, f"manifest {cid} is a {manifest.kind!r}, not an update")
    extra = manifest.extra or {}
    used = extra.get("codec", "f32")
    if used != codec:
        raise MalformedUpdateError(
            peer, f"update {cid} is encoded with {used!r}, the run uses {codec!r}"
        )
    if extra.get("layout") != UPDATE_LAYOUT:
        raise MalformedUpdateError(
            peer, f"update {cid} has layout {extra.get('layout')!r}, not {UPDATE_LAYOUT!r}"
        )
    return manifest


def load_segments(
    store: BlockStore,
    cid: CID,
    *,
    peer: str,
    codec: str,
    numel: int,
    indices: Sequence[int],
    manifest: Manifest | None = None,
) -> dict[int, torch.Tensor]:
    """Decode segments ``indices`` of the update at ``cid`` (a state of ``numel`` values).

    Only those layers' chunks must be in ``store`` (and the manifest's nodes). Raises
    MalformedUpdateError when the update breaks the layout (a layer missing, extra or of the
    wrong length, a bad encoding): bytes that prove the sender wrong, like NaN. ``manifest``:
    the update's, already read by :func:`update_manifest` (a caller decoding segment by
    segment reads it once).
    """
    manifest = manifest or update_manifest(store, cid, peer, codec)
    ranges = segment_ranges(numel)
    names = {layer.name: layer for layer in manifest.layers}
    want = {segment_layer(i) for i in range(len(ranges))}
    if set(names) != want:
        odd = sorted(set(names) ^ want)[:3]
        raise MalformedUpdateError(
            peer, f"update {cid} layers differ from the {len(ranges)} segments: {odd}"
        )
    out: dict[int, torch.Tensor] = {}
    for i in indices:
        start, stop = ranges[i]
        layer = names[segment_layer(i)]
        try:
            encoded = load_layer(store, layer)
        except StorageError as exc:
            raise PeerUpdateError(peer, f"update {cid} segment {i} unreadable: {exc}") from exc
        try:
            out[i] = decode_update_tensor(encoded, codec, (stop - start,))
        except UpdateEncodingError as exc:
            raise MalformedUpdateError(peer, f"update {cid} segment {i}: {exc}") from exc
    return out


def load_update(
    store: BlockStore,
    cid: CID,
    *,
    peer: str,
    codec: str = "f32",
    shapes: Mapping[str, torch.Tensor],
) -> State:
    """Read a whole update and decode it to float32 tensors of ``shapes``' names and shapes.

    PeerUpdateError when it cannot be read; MalformedUpdateError (ban evidence) when it breaks
    the codec or the layout. Non-finite values pass: :func:`aggregate` rejects them by name.
    """
    numel = sum(t.numel() for t in shapes.values())
    segments = load_segments(
        store, cid, peer=peer, codec=codec, numel=numel, indices=range(len(segment_ranges(numel)))
    )
    flat = [segments[i] for i in sorted(segments)]
    return unflatten_segments(flat, {name: tuple(t.shape) for name, t in shapes.items()})


def expected_specs(state: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """What every update of a round must look like: the state's names, shapes, float32."""
    return {name: TensorSpec(tuple(t.shape), torch.float32) for name, t in state.items()}


@dataclass(frozen=True)
class RoundResult:
    """The outcome of aggregating one round."""

    state: State  # the outer step of parent and aggregate (model/_outer.py)
    state_cid: CID  # see _state.py
    aggregation: AggregationResult  # per-peer records (distance, clip weight, rejection)
    momentum: State | None = None  # the outer momentum after the round (nesterov), else None


def streams_updates(members: int, state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a full round of ``members`` updates of ``state``'s size reads them one layer at
    a time (past WHOLE_UPDATES_MAX_BYTES of decoded float32 updates) rather than whole."""
    numel = sum(t.numel() for t in state.values())
    return members * numel * 4 > limits.WHOLE_UPDATES_MAX_BYTES


def aggregate_round(
    parent: State,
    updates: Mapping[str, Mapping[str, torch.Tensor]],
    config: TrainingConfig,
    momentum: State | None = None,
    *,
    by_layer: bool = False,
) -> RoundResult:
    """Aggregate the round's updates with the run's rule and take the outer step from ``parent``
    (and ``momentum``, the outer momentum before the round; None starts from zeros).

    Deterministic: the aggregation orders peers by id and the outer step is a fixed sequence of
    elementwise float32 ops per layer on the CPU, so every honest node gets the same bytes.

    A round whose agreed set is empty (nobody's update was held by a majority of its members)
    applies nothing: the state and the momentum stay the parent's, on every node alike.

    ``by_layer``: the updates are mappings that decode a layer on lookup (SegmentedUpdate), read
    one layer at a time (aggregation.aggregate's by_layer): the same bits, n x one layer held.
    """
    rule = AggregatorConfig(name=config.aggregator, params=dict(config.aggregator_params))
    if uses_momentum(config) and momentum is None:
        momentum = zero_momentum(parent)
    if not updates:
        unchanged = {name: t.clone() for name, t in parent.items()}
        nothing = AggregationResult({}, {}, {"rule": config.aggregator, "accepted": 0})
        return RoundResult(unchanged, state_cid(unchanged), nothing, momentum)
    result = aggregate(updates, expected=expected_specs(parent), config=rule, by_layer=by_layer)
    new, new_momentum = outer_step(parent, momentum, result.tensors, config)
    return RoundResult(new, state_cid(new), result, new_momentum)
