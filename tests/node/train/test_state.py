"""The state CID: equal weights give equal CIDs whatever the metadata; it matches manifests."""

from __future__ import annotations

from pathlib import Path

import torch

from cnode.node.train import TrainingConfig, build_model, model_state
from cnode.node.train.model._state import layer_chunk_cids, state_cid, state_cid_from_layers
from cnode.storage import BlockStore, CheckpointMeta, read_manifest, save_checkpoint


def test_state_cid_equals_the_cid_computed_from_a_stored_manifest(tmp_path: Path) -> None:
    state = model_state(build_model(TrainingConfig()))
    state["big"] = torch.arange(300_000, dtype=torch.float32)  # 1.2 MB: two chunks
    store = BlockStore(tmp_path / "blocks")
    cids = []
    for round_ in (3, 4):
        meta = CheckpointMeta(run_id="r", kind="checkpoint", round=round_, extra={"x": round_})
        cids.append(save_checkpoint(store, state, meta))
    assert cids[0] != cids[1]  # the manifests differ (metadata) ...
    for cid in cids:
        manifest = read_manifest(store, cid)
        rows = [(la.name, la.dtype, la.shape, la.chunks) for la in manifest.layers]
        assert state_cid_from_layers(rows) == state_cid(state)  # ... the state CID does not
    assert len(layer_chunk_cids(state["big"])) == 2


def test_one_changed_value_changes_the_state_cid_and_order_does_not() -> None:
    state = model_state(build_model(TrainingConfig()))
    before = state_cid(state)
    assert state_cid(dict(reversed(list(state.items())))) == before
    name = sorted(state)[0]
    state[name] = state[name].clone()
    state[name].view(-1)[0] += 1e-7
    assert state_cid(state) != before
    assert str(before).startswith("bafy")
