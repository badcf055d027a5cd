"""CIDv1 with sha2-256, base32 text: the only module that parses or encodes CIDs.

See specs/manifest.md#cids. Binary form: varint(version=1) varint(codec) varint(0x12) varint(32)
digest. Text form: multibase ``b`` + lower-case RFC 4648 base32 without padding. Varints must be
minimal, so every CID has exactly one binary and one text form.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

import multiformats

from . import limits
from ._exceptions import BlockMismatchError, BlockTooLargeError, InvalidCIDError

RAW = 0x55
DAG_CBOR = 0x71
DAG_PB = 0x70  # UnixFS directory and file nodes (specs/manifest.md#unixfs-view)
SHA2_256 = 0x12

_CODEC_NAMES = {RAW: "raw", DAG_CBOR: "dag-cbor", DAG_PB: "dag-pb"}


def varint(n: int) -> bytes:
    """The unsigned varint of ``n`` (CIDs here, CAR section lengths in ``_car``)."""
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# The longest varint read anywhere: 9 bytes carry 63 bits.
MAX_VARINT_LEN = 9


class VarintError(ValueError):
    """Internal: bytes are not a minimal varint (callers name what they were reading)."""


def read_varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Read a minimal unsigned varint (at most 9 bytes) at ``pos``; return (value, new pos).

    Raises VarintError ("truncated varint", "non-minimal varint", "varint too long").
    """
    value = 0
    for i in range(MAX_VARINT_LEN):
        if pos + i >= len(data):
            raise VarintError("truncated varint")
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if byte == 0 and i > 0:
                raise VarintError("non-minimal varint")
            return value, pos + i + 1
    raise VarintError("varint too long")


def _read_cid_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    try:
        return read_varint(data, pos)
    except VarintError as exc:
        raise InvalidCIDError(f"{exc} in CID") from None


@dataclass(frozen=True, slots=True)
class CID:
    """A CIDv1 naming a block by its sha2-256 digest.

    ``str(cid)`` is the base32 text (``bafk...`` raw, ``bafy...`` dag-cbor); ``bytes(cid)`` the
    binary form. Construct with :meth:`parse` or :func:`compute_cid`.
    """

    codec: int
    digest: bytes

    def __post_init__(self) -> None:
        if self.codec not in limits.ALLOWED_CODECS:
            raise InvalidCIDError(
                f"CID codec 0x{self.codec:x} is not allowed (raw, dag-cbor or dag-pb)"
            )
        if len(self.digest) != limits.DIGEST_SIZE:
            raise InvalidCIDError(f"CID digest must be {limits.DIGEST_SIZE} bytes")

    @property
    def version(self) -> int:
        return limits.CID_VERSION

    @property
    def hash_code(self) -> int:
        return SHA2_256

    @property
    def codec_name(self) -> str:
        return _CODEC_NAMES[self.codec]

    def __bytes__(self) -> bytes:
        return (
            varint(limits.CID_VERSION)
            + varint(self.codec)
            + varint(SHA2_256)
            + varint(limits.DIGEST_SIZE)
            + self.digest
        )

    def __str__(self) -> str:
        return "b" + base64.b32encode(bytes(self)).decode("ascii").rstrip("=").lower()

    def __repr__(self) -> str:
        return f"CID({str(self)!r})"

    @classmethod
    def parse(cls, value: str | bytes | bytearray | memoryview | CID) -> CID:
        """Parse base32 text or binary form; raise InvalidCIDError naming what is wrong."""
        if isinstance(value, CID):
            return value
        if isinstance(value, str):
            return cls._parse_text(value)
        cid, end = decode_cid_prefix(bytes(value))
        if end != len(value):
            raise InvalidCIDError("trailing bytes after CID")
        return cid

    @classmethod
    def _parse_text(cls, text: str) -> CID:
        shown = text if len(text) <= 80 else text[:77] + "..."
        if text.startswith("Qm") and len(text) == 46:
            raise InvalidCIDError(f"CIDv0 is not supported (need CIDv1 base32): {shown}")
        if not text.startswith("b") or len(text) > 128:
            raise InvalidCIDError(f"not a base32 CIDv1 (must start with 'b'): {shown}")
        body = text[1:]
        if body != body.lower():
            raise InvalidCIDError(f"CID text must be lower-case base32: {shown}")
        try:
            raw = base64.b32decode(body.upper() + "=" * (-len(body) % 8))
        except (binascii.Error, ValueError) as exc:
            raise InvalidCIDError(f"bad base32 in CID {shown}") from exc
        cid = cls.parse(raw)
        if str(cid) != text:
            raise InvalidCIDError(f"non-canonical CID text: {shown}")
        return cid


def decode_cid_prefix(data: bytes | memoryview) -> tuple[CID, int]:
    """Decode a binary CID at the start of ``data``; return it and the number of bytes it used."""
    version, pos = _read_cid_varint(data, 0)
    if version == SHA2_256:
        raise InvalidCIDError("CIDv0 is not supported (need CIDv1)")
    if version != limits.CID_VERSION:
        raise InvalidCIDError(f"unknown CID version {version}")
    codec, pos = _read_cid_varint(data, pos)
    if codec not in limits.ALLOWED_CODECS:
        raise InvalidCIDError(f"CID codec 0x{codec:x} is not allowed (raw, dag-cbor or dag-pb)")
    hash_code, pos = _read_cid_varint(data, pos)
    if hash_code not in limits.ALLOWED_HASHES:
        raise InvalidCIDError(f"CID hash 0x{hash_code:x} is not allowed (sha2-256 only)")
    size, pos = _read_cid_varint(data, pos)
    if size != limits.DIGEST_SIZE:
        raise InvalidCIDError(f"CID digest size {size} is not {limits.DIGEST_SIZE}")
    if pos + size > len(data):
        raise InvalidCIDError("truncated CID digest")
    return CID(codec, bytes(data[pos : pos + size])), pos + size


def new_hash() -> hashlib._Hash:
    """An incremental hash of the CIDs' hash function (for blocks read in pieces)."""
    return hashlib.sha256()


def matches(cid: CID, data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` hashes to ``cid``'s digest (no size check: see :func:`verify_block`)."""
    return hashlib.sha256(data).digest() == cid.digest


def compute_cid(data: bytes | bytearray | memoryview, codec: int = RAW) -> CID:
    """The CID of ``data`` (sha2-256) with ``codec``; raises BlockTooLargeError past 1 MiB."""
    if len(data) > limits.MAX_BLOCK_SIZE:
        raise BlockTooLargeError(
            f"block of {len(data)} bytes exceeds MAX_BLOCK_SIZE {limits.MAX_BLOCK_SIZE}"
        )
    return CID(codec, hashlib.sha256(data).digest())


def verify_block(cid: CID, data: bytes | bytearray | memoryview) -> None:
    """Raise BlockMismatchError unless ``data`` hashes to ``cid`` (and is within size limits)."""
    if len(data) > limits.MAX_BLOCK_SIZE:
        raise BlockTooLargeError(
            f"block {cid} of {len(data)} bytes exceeds MAX_BLOCK_SIZE {limits.MAX_BLOCK_SIZE}"
        )
    if not matches(cid, data):
        raise BlockMismatchError(f"bytes do not match their CID {cid}", cid)


# Resolved once: multiformats checks every argument's type at run time, so building a link from
# names or from bytes (``CID.decode``) cost ~0.4 ms, from these objects ~0.08 ms; a manifest of
# a partitioned round's update has 64 links, encoded twice per save.
_IPLD_BASE = multiformats.multibase.get("base58btc")  # what CID.decode(bytes) sets; not encoded
_IPLD_CODECS = {code: multiformats.multicodec.get(name) for code, name in _CODEC_NAMES.items()}
_IPLD_SHA2_256 = multiformats.multihash.get("sha2-256")


def to_ipld(cid: CID) -> multiformats.CID:
    """The multiformats CID object dag_cbor needs to write a tag-42 link."""
    return multiformats.CID(
        _IPLD_BASE, limits.CID_VERSION, _IPLD_CODECS[cid.codec], (_IPLD_SHA2_256, cid.digest)
    )
