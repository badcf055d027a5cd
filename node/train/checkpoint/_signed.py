"""The signed records a checkpoint names, opened and checked for ``cnode checkpoint verify``.

A checkpoint's aggregation record lists update headers, partition results and score records;
each is a signed envelope whose type says which it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from cnode.storage import CID, BlockStore, Manifest, StorageError

from .._exceptions import PeerUpdateError
from .._round import UpdateHeader, open_update_header
from ..partition import PARTITION_RESULT_TYPE, PartitionResult, envelope_type, open_partition_result
from ..scores import SCORE_RECORD_TYPE, ScoreRecord, open_score_record

__all__ = ["SignedUpdates", "check_signed_updates", "open_signed_record"]


def open_signed_record(
    envelope: bytes, *, run: str
) -> UpdateHeader | PartitionResult | ScoreRecord:
    """A signed record a checkpoint names: an update header, a partition result or a score
    record."""
    kind = envelope_type(envelope)
    if kind == PARTITION_RESULT_TYPE:
        return open_partition_result(envelope, run=run)
    if kind == SCORE_RECORD_TYPE:
        return open_score_record(envelope, run=run)
    return open_update_header(envelope, run=run)


@dataclass(frozen=True)
class SignedUpdates:
    """The signed update headers a checkpoint names, as :func:`check_signed_updates` found them."""

    valid: int  # held, signed by the peer they name, for the checkpoint's run and rounds
    absent: int  # not in the store (not checked)
    faults: tuple[tuple[CID, str], ...]  # (header CID, why it is not a valid signed header)


def check_signed_updates(store: BlockStore, manifest: Manifest) -> SignedUpdates:
    """Check the signature, run and round of every held header the aggregation record names.

    The storage layer checks that each named block hashes right; what it is (a signed
    ``cnode/update-header/v1`` envelope of this run, of a round this checkpoint covers) is
    checked here, for ``cnode checkpoint verify``.
    """
    meta = getattr(manifest, "meta", manifest)
    if meta.aggregation is None:
        return SignedUpdates(0, 0, ())
    valid = absent = 0
    faults: list[tuple[CID, str]] = []
    for cid in meta.aggregation.updates:
        try:
            envelope = store.get(cid)
        except StorageError:
            absent += 1  # missing or corrupt: storage's verify already reports it
            continue
        try:
            header = open_signed_record(envelope, run=meta.run_id)
        except PeerUpdateError as exc:
            faults.append((cid, exc.reason))
            continue
        if header.round > meta.round:
            faults.append((cid, f"header of round {header.round}, after the checkpoint's"))
            continue
        valid += 1
    return SignedUpdates(valid, absent, tuple(faults))
