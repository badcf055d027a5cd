"""Exceptions of cnode.storage.

::

    CnodeError
    └── StorageError                      anything in cnode.storage
        ├── InvalidCIDError               a CID that does not parse, or uses a version/codec/hash
        │                                 outside the allowlist
        ├── BlockMismatchError            bytes that do not hash to the CID they came with
        │   └── CorruptBlockError         a stored block failed verification on read (quarantined)
        ├── BlockTooLargeError            a block over limits.MAX_BLOCK_SIZE
        ├── BlockNotFoundError            the store does not hold the block
        ├── CBORDecodeError               malformed, truncated or too deep DAG-CBOR
        │   └── NonCanonicalCBORError     decodes, but is not the one canonical encoding
        ├── ManifestError                 a manifest breaks the schema or a limit
        ├── CheckpointError               a state dict or meta that cannot be stored (our caller's
        │                                 fault: bad layer name, duplicate, unsupported dtype)
        ├── CARError                      a CAR file that is truncated, malformed or incomplete
        └── HFFolderError                 a Hugging Face folder that cannot be exported or imported

Remote or file input errors carry the CID, file or layer name in their message.
"""

from __future__ import annotations

from cnode import CnodeError


class StorageError(CnodeError):
    """Raised by cnode.storage when a block, manifest or file cannot be used."""


class InvalidCIDError(StorageError):
    """Raised by CID.parse when the text or bytes are not an allowed CIDv1."""


class BlockMismatchError(StorageError):
    """Raised by verify_block and BlockStore.put when bytes do not hash to their CID."""

    def __init__(self, message: str, cid: object = None) -> None:
        super().__init__(message)
        self.cid = cid
        self.computed: object = None  # what the bytes hash to, when known (verify_received)


class CorruptBlockError(BlockMismatchError):
    """Raised by BlockStore reads when a stored block fails verification; it is quarantined."""


class BlockTooLargeError(StorageError):
    """Raised when a block is larger than limits.MAX_BLOCK_SIZE."""


class BlockNotFoundError(StorageError):
    """Raised by BlockStore reads when the block is not held."""

    def __init__(self, message: str, cid: object = None) -> None:
        super().__init__(message)
        self.cid = cid


class CBORDecodeError(StorageError):
    """Raised when DAG-CBOR bytes are malformed, truncated, oversize or nested too deep."""


class NonCanonicalCBORError(CBORDecodeError):
    """Raised when DAG-CBOR bytes decode but are not in strict canonical form."""


class ManifestError(StorageError):
    """Raised when a manifest (or one of its linked nodes) breaks the schema or a limit."""


class CheckpointError(StorageError):
    """Raised by save_checkpoint when the caller's state dict or meta cannot be stored."""


class CARError(StorageError):
    """Raised when a CAR file is truncated, malformed, has no usable root or is incomplete."""


class HFFolderError(StorageError):
    """Raised when a Hugging Face model folder cannot be written or read."""
