import os
import stat
from pathlib import Path

import base58
import pytest
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.secp256k1 import create_new_key_pair as secp_key_pair
from libp2p.peer.id import ID

from cnode.auth import (
    Identity,
    IdentityError,
    PeerIdError,
    load_identity,
    public_key_from_peer_id,
    save_identity,
)
from cnode.auth.limits import KEY_FILE_SIZE


def _saved(tmp_path: Path) -> tuple[Identity, Path]:
    identity = Identity.generate()
    path = tmp_path / "identity.key"
    save_identity(identity, path)
    return identity, path


def test_generate_save_load_roundtrip(tmp_path: Path) -> None:
    identity, path = _saved(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size == KEY_FILE_SIZE
    loaded = load_identity(path)
    assert loaded.peer_id_str == identity.peer_id_str
    assert loaded.peer_id_str.startswith("12D3KooW")
    assert loaded.private_key.to_bytes() == identity.private_key.to_bytes()
    assert list(tmp_path.iterdir()) == [path]  # no temp file left


def test_peer_id_is_libp2p_peer_id_and_key_pair_matches() -> None:
    identity = Identity.generate()
    pair = identity.key_pair()
    assert isinstance(identity.private_key, Ed25519PrivateKey)
    assert ID.from_pubkey(pair.public_key) == identity.peer_id
    assert pair.private_key is identity.private_key
    signature = identity.sign(b"data")
    assert len(signature) == 64
    assert public_key_from_peer_id(identity.peer_id_str).verify(b"data", signature)
    assert not public_key_from_peer_id(identity.peer_id_str).verify(b"other", signature)


def test_repr_hides_private_key() -> None:
    identity = Identity.generate()
    assert identity.private_key.to_bytes().hex() not in repr(identity)
    assert "private" not in repr(identity)


def test_save_replaces_atomically_and_forces_0600(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    os.chmod(path, 0o644)
    other = Identity.generate()
    old_umask = os.umask(0)
    try:
        save_identity(other, path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_identity(path).peer_id_str == other.peer_id_str


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_wider_permissions_refused(tmp_path: Path, mode: int) -> None:
    _, path = _saved(tmp_path)
    before = path.read_bytes()
    os.chmod(path, mode)
    with pytest.raises(IdentityError, match=rf"{path}.*mode {mode:04o}.*must be 0600"):
        load_identity(path)
    assert path.read_bytes() == before  # the file is left as it was


@pytest.mark.parametrize("size", [0, 5, 8, 10, 41, 73])
def test_truncated_file_refused(tmp_path: Path, size: int) -> None:
    _, path = _saved(tmp_path)
    path.write_bytes(path.read_bytes()[:size])
    with pytest.raises(IdentityError, match=rf"{path}.* truncated: {size} bytes"):
        load_identity(path)


def test_too_long_file_refused(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(IdentityError, match="longer than the 74 bytes"):
        load_identity(path)


def test_wrong_key_type_in_header_refused(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[9] = 2  # Secp256k1
    path.write_bytes(bytes(data))
    with pytest.raises(IdentityError, match=rf"{path} holds a Secp256k1 key; cnode needs Ed25519"):
        load_identity(path)


def test_libp2p_secp256k1_protobuf_key_refused(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, secp_key_pair().private_key.serialize())
    os.close(fd)
    with pytest.raises(IdentityError, match="libp2p protobuf Secp256k1 key, not a cnode"):
        load_identity(path)


def test_foreign_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"-----BEGIN OPENSSH PRIVATE KEY-----\n" + b"x" * 60)
    os.close(fd)
    with pytest.raises(IdentityError, match="PEM file"):
        load_identity(path)


def test_corrupt_public_key_refused(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IdentityError, match="corrupt: its public key does not match its seed"):
        load_identity(path)


def test_bad_version_refused(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[8] = 9
    path.write_bytes(bytes(data))
    with pytest.raises(IdentityError, match="format version 9"):
        load_identity(path)


def test_missing_file_and_directory_and_symlink(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match=r"does not exist \(run `cnode init`\)"):
        load_identity(tmp_path / "nope.key")
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    with pytest.raises(IdentityError, match="not a regular file"):
        load_identity(folder)
    _, path = _saved(tmp_path)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(IdentityError, match="is a symbolic link"):
        load_identity(link)


def test_public_key_from_peer_id_refuses_bad_ids() -> None:
    secp_id = ID.from_pubkey(secp_key_pair().public_key).to_base58()
    with pytest.raises(PeerIdError, match="is not an Ed25519 identity-multihash peer id"):
        public_key_from_peer_id(secp_id)
    # right length, but the protobuf says key type 2 (Secp256k1)
    crafted = base58.b58encode(b"\x00\x24\x08\x02\x12\x20" + bytes(32)).decode()
    with pytest.raises(PeerIdError, match="does not hold an Ed25519 public key"):
        public_key_from_peer_id(crafted)
    with pytest.raises(PeerIdError, match="not base58"):
        public_key_from_peer_id("12D3KooW0OIl")  # 0, O, I, l are not base58
    with pytest.raises(PeerIdError, match="not an Ed25519 identity-multihash"):
        public_key_from_peer_id("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")  # sha256 id
    with pytest.raises(PeerIdError, match="not a peer id"):
        public_key_from_peer_id("")
    good = Identity.generate().peer_id_str
    with pytest.raises(PeerIdError, match="not an Ed25519 identity-multihash"):
        public_key_from_peer_id(good[:-2])


def test_identity_equality_and_hash() -> None:
    a = Identity.generate()
    same = Identity(a.private_key)
    assert a == same and hash(a) == hash(same) and len({a, same}) == 1
    assert a != Identity.generate()
    with pytest.raises(ValueError, match="32 bytes"):
        Identity.from_seed(b"short")
