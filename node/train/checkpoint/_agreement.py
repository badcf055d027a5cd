"""The checkpoint agreement check: this node's checkpoint of a round against the swarm's.

Checkpoint manifests are deterministic, so every honest node stores the same bytes: a different
manifest for the same round means a different state, and that is fatal (StateMismatchError),
never repaired silently. A checkpointer submits its manifest (the coordinator refuses a second,
different one for the round, and any for a round older than the one recorded: a checkpointer
that is behind carries on); any other node compares with the one the coordinator recorded.

When no checkpoint is recorded within ``AGREE_WAIT_S`` (the run's checkpointers are not among
the round's members), the other nodes submit theirs. Otherwise the checkpointers, who catch up
like any joiner, would wait for a checkpoint that nobody in the swarm submits, and never join.
A run that names its checkpointers (``access.checkpointers``) refuses these (403
``not_checkpointer``): then nothing changes.
"""

from __future__ import annotations

import structlog
import trio

from cnode.node.coordinator import (
    CheckpointRecord,
    CoordinatorClient,
    CoordinatorRejected,
    ErrorCode,
)
from cnode.node.hub import HubRevision
from cnode.storage import CID

from .. import limits
from .._exceptions import StateMismatchError

__all__ = ["agree_on_checkpoint"]

log = structlog.get_logger(__name__)


async def agree_on_checkpoint(
    client: CoordinatorClient,
    *,
    round_: int,
    epoch: int,
    manifest: CID,
    state_cid: CID,
    submit: bool,
    hub: HubRevision | None = None,
) -> None:
    """Submit (``submit``) or compare ``manifest`` as round ``round_``'s checkpoint."""
    if submit:
        try:
            await client.submit_checkpoint(
                epoch=epoch,
                round=round_,
                manifest=str(manifest),
                hf_repo=None if hub is None else hub.repo,
                hf_revision=None if hub is None else hub.revision,
            )
        except CoordinatorRejected as exc:
            if exc.code is not ErrorCode.STALE_ROUND:
                raise
            # Refused as not newer: another manifest for this round (a different state, fatal),
            # or a later round already recorded (this node is behind: nothing to compare, and
            # no reason to stop; its state meets the next checkpoint).
            record = await client.current_checkpoint()
            if record is None or record.round == round_:
                raise StateMismatchError(
                    f"round {round_}: this node's checkpoint {manifest} (state "
                    f"{state_cid}) differs from the swarm's: {exc}"
                ) from exc
            log.info("checkpoint_superseded", round=round_, recorded=record.round)
        return
    with trio.move_on_after(limits.AGREE_WAIT_S):
        # A long poll answered when the checkpoint is recorded, then one read of the signed
        # state: not a read of the state every POLL_INTERVAL_S by every node (issue 27).
        record = await client.wait_checkpoint(round_)
        _compare(record, round_=round_, manifest=manifest, state_cid=state_cid)
        return
    log.warning("checkpoint_not_confirmed", round=round_, manifest=str(manifest))
    await _submit_unconfirmed(
        client, round_=round_, epoch=epoch, manifest=manifest, state_cid=state_cid
    )


async def _submit_unconfirmed(
    client: CoordinatorClient, *, round_: int, epoch: int, manifest: CID, state_cid: CID
) -> None:
    """Nobody submitted round ``round_``'s checkpoint in time: submit this node's."""
    try:
        await client.submit_checkpoint(epoch=epoch, round=round_, manifest=str(manifest))
    except CoordinatorRejected as exc:
        if exc.code is ErrorCode.STALE_ROUND:  # recorded meanwhile: the same round, or a later one
            _compare(
                await client.current_checkpoint(),
                round_=round_,
                manifest=manifest,
                state_cid=state_cid,
            )
        # not_checkpointer (the run names its checkpointers) and the rest: not this node's
        # duty, and no reason to stop.
        log.info("checkpoint_not_submitted", round=round_, reason=exc.code)
        return
    log.info("checkpoint_submitted_unconfirmed", round=round_, manifest=str(manifest))


def _compare(
    record: CheckpointRecord | None, *, round_: int, manifest: CID, state_cid: CID
) -> None:
    """Raise StateMismatchError if the recorded checkpoint of ``round_`` is not ``manifest``."""
    if record is not None and record.round == round_ and record.manifest != str(manifest):
        raise StateMismatchError(
            f"round {round_}: this node's checkpoint {manifest} (state "
            f"{state_cid}) differs from the swarm's {record.manifest}"
        )
