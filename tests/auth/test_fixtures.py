"""The byte-level fixtures of specs/identity.md (regenerate with their make_fixtures.py)."""

import json
import os
import shutil
from pathlib import Path

import dag_cbor
import pytest

from cnode.auth import DOMAIN, Identity, load_identity, open_envelope, seal

FIXTURES = Path(__file__).resolve().parents[2] / "specs" / "fixtures" / "identity"


@pytest.fixture(scope="module")
def description() -> dict:
    return json.loads((FIXTURES / "envelope-announce.json").read_text())


def test_envelope_fixture_opens_and_is_reproduced(description: dict) -> None:
    data = (FIXTURES / "envelope-announce.cbor").read_bytes()
    assert data.hex() == description["envelope_hex"]
    opened = open_envelope(
        data, expected_type=description["payload_type"], expected_signer=description["peer_id"]
    )
    assert opened.payload == description["payload"]
    identity = Identity.from_seed(bytes.fromhex(description["seed_hex"]))
    assert identity.peer_id_str == description["peer_id"]
    assert identity.peer_id.to_bytes().hex() == description["peer_id_bytes_hex"]
    # Ed25519 is deterministic: sealing again gives the very same bytes.
    assert seal(identity, description["payload_type"], description["payload"]) == data
    assert DOMAIN.hex() == description["domain_hex"]
    signed = bytes.fromhex(description["signed_bytes_hex"])
    assert signed.startswith(DOMAIN)
    fields = dag_cbor.decode(data)
    assert isinstance(fields, dict)
    assert identity.sign(signed) == fields["sig"]


def test_envelope_fixture_layout(description: dict) -> None:
    data = bytes.fromhex(description["envelope_hex"])
    # map(4); keys in DAG-CBOR order: "sig", "type", "signer", "payload"
    assert data[0] == 0xA4
    assert data[1:5] == b"\x63sig" and data[5:7] == b"\x58\x40"
    fields = dag_cbor.decode(data)
    assert isinstance(fields, dict)
    assert list(fields) == ["sig", "type", "signer", "payload"]
    assert fields["signer"] == bytes.fromhex(description["peer_id_bytes_hex"])


def test_key_file_fixture(description: dict, tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    shutil.copyfile(FIXTURES / "identity.key", path)
    os.chmod(path, 0o600)  # git does not keep 0600
    assert path.read_bytes().hex() == description["identity_key_hex"]
    assert load_identity(path).peer_id_str == description["peer_id"]
