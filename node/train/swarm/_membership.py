"""Leaving a round: the one call every path that gives a round up makes (signal, catch-up)."""

from __future__ import annotations

import structlog
import trio

from cnode.node.coordinator import CoordinatorClient, CoordinatorError

from .. import limits

__all__ = ["leave_round"]

log = structlog.get_logger(__name__)


async def leave_round(client: CoordinatorClient, round_: int) -> None:
    """Tell the coordinator this node leaves ``round_``, giving it LEAVE_WAIT_S.

    Before the round's list closes the round goes on without the node; after, the coordinator
    drops it at the deadline anyway, so a refusal or no answer is logged, never raised.
    """
    with trio.move_on_after(limits.LEAVE_WAIT_S):
        try:
            await client.leave(round_)
        except CoordinatorError as exc:  # e.g. the round is over already
            log.info("leave_refused", round=round_, error=str(exc))
