"""storage/_state.py and tensor_layer: the state CID is computed by the code checkpoints use."""

from __future__ import annotations

import hashlib

import dag_cbor
import torch

from cnode.storage import (
    CID,
    DAG_CBOR,
    BlockStore,
    read_manifest,
    save_checkpoint,
    state_cid_of_layers,
    tensor_layer,
)

from .conftest import meta, small_state


def test_tensor_layer_is_the_layer_save_checkpoint_writes(store: BlockStore) -> None:
    state = small_state()
    manifest = read_manifest(store, save_checkpoint(store, state, meta()))
    assert list(manifest.layers) == [tensor_layer(name, t) for name, t in state.items()]
    assert len(tensor_layer("e", state["embed.weight"]).chunks) == 2


def test_state_cid_of_a_checkpoint_equals_the_state_cid_of_its_tensors(store: BlockStore) -> None:
    state = small_state(1)
    manifest = read_manifest(store, save_checkpoint(store, state, meta()))
    from_manifest = state_cid_of_layers(
        (la.name, la.dtype, la.shape, la.chunks) for la in manifest.layers
    )
    layers = [tensor_layer(name, t) for name, t in state.items()]
    from_tensors = state_cid_of_layers((la.name, la.dtype, la.shape, la.chunks) for la in layers)
    assert from_manifest == from_tensors


def test_state_cid_follows_the_spec_written_out_by_hand() -> None:
    # specs/training.md#state-cid, with nothing of cnode but the CID's text form.
    state = {"b": torch.arange(300_000, dtype=torch.float32), "a": torch.ones(2, 3)}
    rows = []
    for name in sorted(state):
        data = state[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        chunks = [
            str(CID(0x55, hashlib.sha256(data[i : i + (1 << 20)]).digest()))
            for i in range(0, len(data), 1 << 20)
        ]
        rows.append([name, "float32", list(state[name].shape), chunks])
    expected = CID(DAG_CBOR, hashlib.sha256(dag_cbor.encode({"v": 1, "layers": rows})).digest())
    layers = [tensor_layer(name, t) for name, t in state.items()]
    got = state_cid_of_layers((la.name, la.dtype, la.shape, la.chunks) for la in layers)
    assert got == expected
