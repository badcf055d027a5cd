"""specs/fixtures/training: the spec's bytes, loaded and checked against the code."""

from __future__ import annotations

import json
from pathlib import Path

from cnode.auth import Identity
from cnode.node.train import TrainingConfig, UpdateHeader, open_update_header, seal_update_header
from cnode.node.train._round import header_cid
from cnode.node.train.checkpoint._checkpoint import genesis_state
from cnode.node.train.model._state import state_cid
from cnode.storage import CID

FIXTURES = Path(__file__).resolve().parents[3] / "specs" / "fixtures" / "training"


def test_update_header_fixture_opens_and_reseals_to_the_same_bytes() -> None:
    expected = json.loads((FIXTURES / "update-header.json").read_text())
    envelope = (FIXTURES / "update-header.cbor").read_bytes()
    header = open_update_header(envelope, run="fixture-run", round_=3, signer=expected["signer"])
    assert header.to_payload() == expected["payload"]
    assert str(header_cid(envelope)) == expected["header_cid"]
    identity = Identity.from_seed(bytes.fromhex(expected["key_seed_hex"]))
    again = UpdateHeader.from_payload(expected["payload"], identity.peer_id_str)
    assert seal_update_header(identity, again) == envelope  # Ed25519 signatures are deterministic


def test_default_genesis_state_cid_is_the_recorded_one() -> None:
    # Every node of a run must build the same round-0 weights from the config and seed.
    expected = json.loads((FIXTURES / "update-header.json").read_text())
    assert state_cid(genesis_state(TrainingConfig())) == CID.parse(expected["genesis_state_cid"])


def test_partition_result_fixture_opens_and_reseals_to_the_same_bytes() -> None:
    from cnode.node.train import (
        PartitionResult,
        open_partition_result,
        partition_result_cid,
        seal_partition_result,
    )

    expected = json.loads((FIXTURES / "partition-result.json").read_text())
    envelope = (FIXTURES / "partition-result.cbor").read_bytes()
    result = open_partition_result(envelope, run="fixture-run", round_=3, signer=expected["signer"])
    assert result.to_payload() == expected["payload"]
    assert str(partition_result_cid(envelope)) == expected["result_cid"]
    identity = Identity.from_seed(bytes.fromhex(expected["key_seed_hex"]))
    again = PartitionResult.from_payload(expected["payload"], identity.peer_id_str)
    assert seal_partition_result(identity, again) == envelope
