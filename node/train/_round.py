"""One round, without the network: store an update, sign its header, check others', aggregate.

Everything here is a pure function of its inputs and a block store, so the same code serves the
live loop, a late joiner replaying rounds, and ``cnode checkpoint verify --replay``.
See specs/training.md#a-round.
"""

from __future__ import annotations

from collections.abc import Mapping
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
)
from cnode.auth import EnvelopeError, Identity, open_envelope, seal
from cnode.storage import (
    CID,
    DAG_CBOR,
    BlockStore,
    CheckpointMeta,
    StorageError,
    compute_cid,
    load_checkpoint,
    save_checkpoint,
)

from . import limits
from ._config import TrainingConfig
from ._exceptions import MalformedUpdateError, PeerUpdateError
from ._model import State
from ._state import state_cid

__all__ = [
    "UPDATE_HEADER_TYPE",
    "RoundResult",
    "UpdateHeader",
    "aggregate_round",
    "encode_update",
    "expected_specs",
    "header_cid",
    "load_update",
    "open_update_header",
    "seal_update_header",
    "store_update",
]

log = structlog.get_logger(__name__)

UPDATE_HEADER_TYPE = "cnode/update-header/v1"


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


def seal_update_header(identity: Identity, header: UpdateHeader) -> bytes:
    """The header as a signed envelope (``cnode/update-header/v1``)."""
    if header.peer != identity.peer_id_str:
        raise ValueError("an update header is signed by the peer it names")
    return seal(identity, UPDATE_HEADER_TYPE, header.to_payload())


def header_cid(envelope: bytes) -> CID:
    """The CID a signed header is stored and referenced under (a DAG-CBOR block)."""
    return compute_cid(envelope, DAG_CBOR)


def open_update_header(
    envelope: bytes, *, run: str, round_: int | None = None, signer: str | None = None
) -> UpdateHeader:
    """Verify a signed header's size, signature, run and round; raise PeerUpdateError if bad."""
    who = signer or "unknown peer"
    if len(envelope) > limits.MAX_UPDATE_HEADER_BYTES:
        raise PeerUpdateError(who, f"header of {len(envelope)} bytes > MAX_UPDATE_HEADER_BYTES")
    try:
        opened = open_envelope(envelope, expected_type=UPDATE_HEADER_TYPE, expected_signer=signer)
    except EnvelopeError as exc:
        raise PeerUpdateError(who, f"bad header envelope: {exc}") from exc
    header = UpdateHeader.from_payload(opened.payload, opened.signer)
    if header.run != run:
        raise PeerUpdateError(opened.signer, f"header is for run {header.run!r}, not {run!r}")
    if round_ is not None and header.round != round_:
        raise PeerUpdateError(opened.signer, f"header is for round {header.round}, not {round_}")
    return header


def encode_update(delta: State, codec: str) -> tuple[State, State]:
    """``delta`` encoded with ``codec`` (what is stored) and what every receiver decodes from it.

    The difference ``delta - decoded`` is the sender's quantization residual (error feedback,
    specs/training.md#error-feedback).
    """
    encoded: State = {}
    decoded: State = {}
    for name in sorted(delta):
        tensor = delta[name].to(torch.float32).contiguous()
        encoded[name] = encode_update_tensor(tensor, codec)
        decoded[name] = decode_update_tensor(encoded[name], codec, tuple(tensor.shape))
    return encoded, decoded


def store_update(
    store: BlockStore, encoded: State, *, run: str, round_: int, base: CID, codec: str = "f32"
) -> CID:
    """Store an encoded update as blocks (a ``kind="update"`` manifest); return the manifest CID.

    ``encoded`` is what :func:`encode_update` made with ``codec`` (for ``f32``, the delta
    itself); the manifest records the codec (``extra.codec``), so the update manifest CID that
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
        extra={"base": str(base), "codec": codec},
    )
    return save_checkpoint(store, encoded, meta)


def load_update(
    store: BlockStore,
    cid: CID,
    *,
    peer: str,
    codec: str = "f32",
    shapes: Mapping[str, torch.Tensor] | None = None,
) -> State:
    """Read an update manifest from ``store`` and decode it; PeerUpdateError if it is bad.

    The manifest must be a ``kind="update"`` manifest whose ``extra.codec`` (absent: ``f32``) is
    the run's ``codec``. Each layer named in ``shapes`` (the parent state) is decoded to float32
    of that tensor's shape (required for ``bf16`` and ``int8-blockwise``); other layers are
    passed on as stored, for :func:`aggregate` to reject by name. ``f32`` tensors are returned
    as stored: :func:`aggregate` checks them as it always did.
    """
    try:
        tensors, manifest = load_checkpoint(store, cid)
    except StorageError as exc:
        raise PeerUpdateError(peer, f"update {cid} unreadable: {exc}") from exc
    if manifest.kind != "update":
        raise PeerUpdateError(peer, f"manifest {cid} is a {manifest.kind!r}, not an update")
    used = (manifest.extra or {}).get("codec", "f32")
    if used != codec:
        raise MalformedUpdateError(
            peer, f"update {cid} is encoded with {used!r}, the run uses {codec!r}"
        )
    if codec == "f32":
        return tensors  # float32 as stored: aggregate() checks names, shapes, dtype, finiteness
    if shapes is None:
        raise ValueError(f"decoding a {codec} update needs the expected shapes")
    decoded: State = {}
    for name in sorted(tensors):
        if name not in shapes:
            decoded[name] = tensors[name]
            continue
        try:
            decoded[name] = decode_update_tensor(tensors[name], codec, tuple(shapes[name].shape))
        except UpdateEncodingError as exc:
            raise MalformedUpdateError(peer, f"update {cid} layer {name!r}: {exc}") from exc
    return decoded


def expected_specs(state: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """What every update of a round must look like: the state's names, shapes, float32."""
    return {name: TensorSpec(tuple(t.shape), torch.float32) for name, t in state.items()}


@dataclass(frozen=True)
class RoundResult:
    """The outcome of aggregating one round."""

    state: State  # parent + outer_lr * aggregate
    state_cid: CID  # see _state.py
    aggregation: AggregationResult  # per-peer records (distance, clip weight, rejection)


def aggregate_round(
    parent: State, updates: Mapping[str, State], config: TrainingConfig
) -> RoundResult:
    """Aggregate the round's updates with the run's rule and apply them to ``parent``.

    Deterministic: the aggregation orders peers by id and the apply is one elementwise float32
    add per layer, so every honest node gets the same bytes.

    A round whose agreed set is empty (nobody's update was held by a majority of its members)
    applies nothing: the state stays the parent's, on every node alike.
    """
    rule = AggregatorConfig(name=config.aggregator, params=dict(config.aggregator_params))
    if not updates:
        unchanged = {name: t.clone() for name, t in parent.items()}
        nothing = AggregationResult({}, {}, {"rule": config.aggregator, "accepted": 0})
        return RoundResult(unchanged, state_cid(unchanged), nothing)
    result = aggregate(updates, expected=expected_specs(parent), config=rule)
    new: State = {}
    for name, base in parent.items():
        step = result.tensors[name].to(torch.float32)
        if config.outer_lr != 1.0:
            step = step * config.outer_lr
        new[name] = (base + step).contiguous()
    return RoundResult(new, state_cid(new), result)
