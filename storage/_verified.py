"""A received block whose bytes were hashed once, on receipt: what lets the store skip a hash.

Without it a received block is hashed twice: by the requester, which must check the bytes before
anything else touches them (specs/blocks.md), and again by :meth:`BlockStore.put`. The requester
calls :func:`verify_received`, the one hash, and hands the :class:`VerifiedBlock` it returns to
:meth:`BlockStore.put_verified`, which writes without hashing again.

A ``VerifiedBlock`` is a capability: the only way to make one is :func:`verify_received`, which
hashes the bytes; its constructor refuses every other caller, and it holds immutable ``bytes``
and refuses attribute changes, copies and pickling. So a put that skips the hash of bytes never
hashed is impossible through the package's API (``tests/storage/test_verified.py``).
``BlockStore.readinto``/``get`` and ``cnode checkpoint verify`` still check every block on disk.
"""

from __future__ import annotations

from typing import Any, NoReturn, final

from ._cid import CID, compute_cid
from ._exceptions import BlockMismatchError

__all__ = ["VerifiedBlock", "verify_received"]

_MINT = object()  # held by this module only; VerifiedBlock.__init__ demands it


@final
class VerifiedBlock:
    """Bytes proven to hash to ``cid``; made only by :func:`verify_received`."""

    __slots__ = ("_cid", "_data")
    _cid: CID
    _data: bytes

    def __init__(self, cid: CID, data: bytes, *, _mint: object = None) -> None:
        if _mint is not _MINT:
            raise TypeError("a VerifiedBlock is made only by verify_received(), which hashes it")
        object.__setattr__(self, "_cid", cid)
        object.__setattr__(self, "_data", data)

    @property
    def cid(self) -> CID:
        return self._cid

    @property
    def data(self) -> bytes:
        return self._data

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError("a VerifiedBlock cannot be changed")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("a VerifiedBlock cannot be changed")

    def __reduce__(self) -> NoReturn:
        raise TypeError("a VerifiedBlock cannot be copied or pickled")

    def __repr__(self) -> str:
        return f"VerifiedBlock({self._cid}, {len(self._data)} bytes)"


def verify_received(claimed: CID, data: bytes) -> VerifiedBlock:
    """Hash ``data`` once; return it as a VerifiedBlock when it is ``claimed``'s bytes.

    Raises:
        BlockMismatchError: the bytes hash to another CID (``.cid`` the claimed one,
            ``.computed`` what they hash to).
        BlockTooLargeError: over MAX_BLOCK_SIZE.
        TypeError: ``data`` is not ``bytes`` (mutable buffers could change after the hash).
    """
    if type(data) is not bytes:
        raise TypeError(f"verify_received takes bytes, not {type(data).__name__}")
    computed = compute_cid(data, claimed.codec)
    if computed != claimed:
        error = BlockMismatchError(f"bytes sent for {claimed} hash to {computed}", claimed)
        error.computed = computed
        raise error
    return VerifiedBlock(claimed, data, _mint=_MINT)
