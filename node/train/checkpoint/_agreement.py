"""The checkpoint agreement check: this node's checkpoint of a round against the swarm's.

Checkpoint manifests are deterministic, so every honest node stores the same bytes: a different
manifest for the same round means a different state, and that is fatal (StateMismatchError),
never repaired silently. A checkpointer submits its manifest (the coordinator refuses a second,
different one for the round); any other node compares with the one the coordinator recorded.
"""

from __future__ import annotations

import structlog
import trio

from cnode.node.coordinator import CoordinatorClient, CoordinatorRejected
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
            if exc.code == "stale_round":
                raise StateMismatchError(
                    f"round {round_}: this node's checkpoint {manifest} (state "
                    f"{state_cid}) differs from the swarm's: {exc}"
                ) from exc
            raise
        return
    with trio.move_on_after(limits.AGREE_WAIT_S):
        # A long poll answered when the checkpoint is recorded, then one read of the signed
        # state: not a read of the state every POLL_INTERVAL_S by every node (issue 27).
        record = await client.wait_checkpoint(round_)
        if record is not None and record.round == round_ and record.manifest != str(manifest):
            raise StateMismatchError(
                f"round {round_}: this node's checkpoint {manifest} (state "
                f"{state_cid}) differs from the swarm's {record.manifest}"
            )
        return
    log.warning("checkpoint_not_confirmed", round=round_, manifest=str(manifest))
