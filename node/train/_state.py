"""The state CID: one hash that says two nodes hold bit-identical weights.

Definition (specs/training.md#state-cid): each layer's tensor is taken as its contiguous
little-endian bytes, cut into ``CHUNK_SIZE`` slices, and each slice is named by its raw CID
exactly as the storage layer names checkpoint chunks. The state CID is the DAG-CBOR CID of::

    {"v": 1, "layers": [[name, dtype, [dim, ...], [chunk CID text, ...]], ...]}   # sorted by name

It leaves out everything volatile (round, timestamps, parent, aggregation record), so two nodes that
store the same weights under different metadata still agree, and it can be compared with the layer
CIDs of any manifest without fetching a single tensor byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dag_cbor
import torch

from cnode.storage import CID, compute_cid
from cnode.storage.limits import CHUNK_SIZE

__all__ = ["layer_chunk_cids", "state_cid", "state_cid_from_layers", "tensor_bytes"]

_DAG_CBOR = 0x71
STATE_CID_VERSION = 1


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's contiguous little-endian bytes (the machines we run on are little-endian)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def layer_chunk_cids(tensor: torch.Tensor) -> list[CID]:
    """The raw CIDs of the tensor's ``CHUNK_SIZE`` slices, as a checkpoint would store them."""
    data = memoryview(tensor_bytes(tensor))  # an empty tensor has no chunks, as in storage
    return [compute_cid(data[i : i + CHUNK_SIZE]) for i in range(0, len(data), CHUNK_SIZE)]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def state_cid_from_layers(layers: Sequence[tuple[str, str, Sequence[int], Sequence[CID]]]) -> CID:
    """The state CID of layers given as (name, dtype, shape, chunk CIDs), e.g. from a manifest."""
    rows: list[Any] = [
        [name, dtype, [int(d) for d in shape], [str(c) for c in chunks]]
        for name, dtype, shape, chunks in sorted(layers, key=lambda row: row[0])
    ]
    return compute_cid(dag_cbor.encode({"v": STATE_CID_VERSION, "layers": rows}), _DAG_CBOR)


def state_cid(state: Mapping[str, torch.Tensor]) -> CID:
    """The state CID of ``{name: tensor}`` (see the module docstring)."""
    return state_cid_from_layers(
        [
            (name, _dtype_name(t.dtype), tuple(t.shape), layer_chunk_cids(t))
            for name, t in state.items()
        ]
    )
