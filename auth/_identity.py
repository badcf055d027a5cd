"""The node's Ed25519 identity: key file, peer id, signing. See specs/identity.md#key-file.

The key is a py-libp2p ``Ed25519PrivateKey``, so the same key authenticates the libp2p connection
(noise) and signs envelopes; the peer id is libp2p's: the identity multihash of the protobuf
``PublicKey`` ``{type: Ed25519, data: 32 bytes}``, written in base58btc (``12D3KooW...``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import base58
from libp2p.crypto.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from libp2p.crypto.keys import KeyPair, KeyType
from libp2p.peer.id import ID
from nacl.exceptions import CryptoError

from . import limits
from ._exceptions import IdentityError, PeerIdError

KEY_MAGIC = b"CNODEKEY"  # first 8 bytes of every identity key file
KEY_VERSION = 1  # byte 8
KEY_TYPE_ED25519 = int(KeyType.Ed25519.value)  # byte 9: libp2p's KeyType number (1)
# A libp2p protobuf PublicKey for Ed25519: field 1 (varint) = 1, field 2 (bytes, len 32).
_PB_ED25519_PUBLIC_PREFIX = b"\x08\x01\x12\x20"
_PB_KEY_NAMES: dict[int, str] = {int(t.value): t.name for t in KeyType}


@dataclass(frozen=True)
class Identity:
    """One node's Ed25519 key pair; ``repr`` never shows the private key."""

    private_key: Ed25519PrivateKey = field(repr=False)

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity."""
        return cls(Ed25519PrivateKey.new())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """The identity whose 32-byte Ed25519 seed is ``seed`` (fixtures, tests)."""
        if len(seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_bytes(seed))

    @functools.cached_property
    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey(self.private_key.impl.verify_key)

    @functools.cached_property
    def peer_id(self) -> ID:
        return ID.from_pubkey(self.public_key)

    @property
    def peer_id_str(self) -> str:
        return self.peer_id.to_base58()

    def key_pair(self) -> KeyPair:
        """The libp2p KeyPair for ``new_host(key_pair=...)``."""
        return KeyPair(self.private_key, self.public_key)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self.private_key.sign(data)

    def __hash__(self) -> int:  # libp2p keys define __eq__ but no __hash__
        return hash(self.peer_id.to_bytes())


def _key_file_bytes(identity: Identity) -> bytes:
    seed = identity.private_key.to_bytes()
    return (
        KEY_MAGIC + bytes([KEY_VERSION, KEY_TYPE_ED25519]) + seed + identity.public_key.to_bytes()
    )


def save_identity(identity: Identity, path: Path | str) -> None:
    """Write ``identity`` to ``path`` with mode 0600, atomically (temp file, fsync, rename).

    The parent folder is created (mode 0700) if missing. An existing file is replaced: callers
    that must keep an old key (``cnode init --force``) back it up first.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise IdentityError(f"cannot write key file {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask said
            f.write(_key_file_bytes(identity))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise IdentityError(f"cannot write key file {path}: {exc.strerror}") from exc


def _describe_foreign(data: bytes) -> str:
    """A guess at what a non-cnode key file holds, for the error message."""
    # A libp2p protobuf PrivateKey begins with field 1 (key type, varint): 0x08 <type>.
    if len(data) >= 4 and data[0] == 0x08 and data[1] in _PB_KEY_NAMES and data[2] == 0x12:
        name = _PB_KEY_NAMES[data[1]]
        return f"a libp2p protobuf {name} key, not a cnode Ed25519 key file"
    if data.startswith(b"-----BEGIN"):
        return "a PEM file, not a cnode Ed25519 key file"
    return "no cnode key file header (expected magic CNODEKEY)"


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def load_identity(path: Path | str) -> Identity:
    """Read a key file written by :func:`save_identity`.

    Raises:
        IdentityError: the file is missing or unreadable, readable by group/others, not a regular
            file, truncated or too long, not a cnode key file, not Ed25519, or corrupt (the stored
            public key does not match the seed). The message names the file and the problem.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        raise IdentityError(f"key file {path} does not exist (run `cnode init`)") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IdentityError(
                f"key file {path} is a symbolic link; give the file itself"
            ) from exc
        raise IdentityError(f"cannot open key file {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IdentityError(f"key file {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise IdentityError(
                f"key file {path} has mode {mode:04o}: group/others may read it; "
                f"it must be 0600 (chmod 600 {path})"
            )
        data = _read_at_most(fd, limits.KEY_FILE_SIZE + 1)
    except OSError as exc:
        raise IdentityError(f"cannot read key file {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if not data.startswith(KEY_MAGIC):
        if len(data) < len(KEY_MAGIC) and KEY_MAGIC.startswith(data):
            raise IdentityError(f"key file {path} is truncated: {len(data)} bytes")
        raise IdentityError(f"key file {path} holds {_describe_foreign(data)}")
    if len(data) < limits.KEY_FILE_SIZE:
        raise IdentityError(
            f"key file {path} is truncated: {len(data)} bytes, expected {limits.KEY_FILE_SIZE}"
        )
    if len(data) > limits.KEY_FILE_SIZE:
        raise IdentityError(
            f"key file {path} is longer than the {limits.KEY_FILE_SIZE} bytes of a key file"
        )
    version, key_type = data[8], data[9]
    if version != KEY_VERSION:
        raise IdentityError(f"key file {path} has format version {version}, expected 1")
    if key_type != KEY_TYPE_ED25519:
        name = _PB_KEY_NAMES.get(key_type, f"unknown type {key_type}")
        raise IdentityError(f"key file {path} holds a {name} key; cnode needs Ed25519")
    seed, stored_public = data[10:42], data[42:74]
    try:
        identity = Identity(Ed25519PrivateKey.from_bytes(seed))
    except (CryptoError, ValueError) as exc:
        raise IdentityError(f"key file {path} holds an invalid Ed25519 seed") from exc
    if identity.public_key.to_bytes() != stored_public:
        raise IdentityError(f"key file {path} is corrupt: its public key does not match its seed")
    return identity


def public_key_from_peer_id(peer_id: str) -> Ed25519PublicKey:
    """The Ed25519 public key inlined in ``peer_id`` (base58btc identity-multihash form).

    Raises:
        PeerIdError: not base58, not an identity multihash, not an Ed25519 key, or not the
            canonical spelling of those bytes.
    """
    raw = peer_id_bytes(peer_id)
    return public_key_from_peer_id_bytes(raw, shown=peer_id)


def peer_id_bytes(peer_id: str) -> bytes:
    """The binary form of a base58btc peer id string (no key check)."""
    if not isinstance(peer_id, str) or not 1 <= len(peer_id) <= 128:
        raise PeerIdError(f"not a peer id: {str(peer_id)[:64]!r}")
    try:
        raw = base58.b58decode(peer_id)
    except ValueError as exc:
        raise PeerIdError(f"peer id {peer_id[:64]!r} is not base58") from exc
    if base58.b58encode(raw).decode() != peer_id:
        raise PeerIdError(f"peer id {peer_id[:64]!r} is not in canonical base58")
    return raw


def public_key_from_peer_id_bytes(raw: bytes, *, shown: str | None = None) -> Ed25519PublicKey:
    """The Ed25519 key inlined in a binary peer id; see :func:`public_key_from_peer_id`."""
    name = shown if shown is not None else peer_id_from_bytes(raw)[:64]
    # identity multihash: code 0x00, length 36, then the protobuf PublicKey (36 bytes).
    if len(raw) != 38 or raw[0] != 0x00 or raw[1] != 36:
        raise PeerIdError(f"peer id {name!r} is not an Ed25519 identity-multihash peer id")
    pb = raw[2:]
    if not pb.startswith(_PB_ED25519_PUBLIC_PREFIX):
        raise PeerIdError(f"peer id {name!r} does not hold an Ed25519 public key")
    try:
        return Ed25519PublicKey.from_bytes(pb[4:])
    except (CryptoError, ValueError) as exc:
        raise PeerIdError(f"peer id {name!r} holds an invalid Ed25519 key") from exc


def peer_id_from_bytes(raw: bytes) -> str:
    """The base58btc text of a binary peer id."""
    return base58.b58encode(raw).decode("ascii")


def peer_id_from_public_key(public_key: Ed25519PublicKey) -> str:
    """The base58btc peer id of an Ed25519 public key."""
    return ID.from_pubkey(public_key).to_base58()
