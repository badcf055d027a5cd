"""The state CID: one hash that says two nodes hold bit-identical weights.

Definition (specs/training.md#state-cid), computed by ``cnode.storage`` with the code that writes
checkpoints: each layer's chunk CIDs are those ``save_checkpoint`` would store, and the state CID
is the DAG-CBOR CID of the sorted (name, dtype, shape, chunk CIDs) rows. It leaves out everything
volatile (round, timestamps, parent, aggregation record), so two nodes that store the same
weights under different metadata still agree, and it can be compared with the layer CIDs of any
manifest without fetching a single tensor byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from cnode.storage import CID, state_cid_of_layers, tensor_layer

__all__ = ["layer_chunk_cids", "state_cid", "state_cid_from_layers"]


def layer_chunk_cids(tensor: torch.Tensor) -> list[CID]:
    """The raw CIDs of the tensor's ``CHUNK_SIZE`` slices, as a checkpoint would store them."""
    return list(tensor_layer("layer", tensor).chunks)


def state_cid_from_layers(layers: Sequence[tuple[str, str, Sequence[int], Sequence[CID]]]) -> CID:
    """The state CID of layers given as (name, dtype, shape, chunk CIDs), e.g. from a manifest."""
    return state_cid_of_layers(layers)


def state_cid(state: Mapping[str, torch.Tensor]) -> CID:
    """The state CID of ``{name: tensor}`` (see the module docstring)."""
    layers = [tensor_layer(name, t) for name, t in state.items()]
    return state_cid_of_layers(
        (layer.name, layer.dtype, layer.shape, layer.chunks) for layer in layers
    )
