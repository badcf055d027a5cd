"""How much one request asks for, and of whom (specs/blocks.md#fetching, 12): the scheduler's
(``_scheduler.Transfer``) batching rule, by the blocks' expected bytes.

Issue 41: counted in blocks, the batch was made for 1 MiB chunks. A sparse update's 64 segments
of ~2 KB came as 8 requests of 8, a fetch from several holders as one request per worker, and a
single block asked of every member went first to whichever worker ran first, which mostly
answered LACKING. At 16 members a node made ~33 requests per member per round, each costing
several ms of CPU on both sides.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable

import trio

from cnode.storage import CID
from cnode.storage import limits as storage_limits

from .. import limits
from ._holders import HolderState

__all__ = ["expected_bytes", "needs_another_holder", "preferred", "take_batch", "take_slot"]


def expected_bytes(sizes: Callable[[CID], int | None] | None) -> Callable[[CID], int]:
    """A block's expected bytes: ``sizes(cid)`` (the manifest's word) or, unknown,
    MAX_BLOCK_SIZE (then the rule is the count rule it replaced: BATCH_BLOCKS per request)."""

    def size(cid: CID) -> int:
        known = sizes(cid) if sizes is not None else None
        return storage_limits.MAX_BLOCK_SIZE if known is None else known

    return size


def take_batch(
    pending: collections.deque[CID],
    holders: Iterable[HolderState],
    holder: HolderState,
    size: Callable[[CID], int],
    slot: Callable[[str], trio.Semaphore],
) -> list[CID]:
    """Take the next request's CIDs for ``holder`` off the front of ``pending``.

    What is left (by ``size``, a block's expected bytes) is shared evenly over every worker of
    every live holder, so no holder idles while another has a queue of its own, but never in
    requests under MIN_SPLIT_BYTES: a fetch of a few small blocks is one request, not one per
    worker. The holder's ``batch_bytes`` and MAX_REQUEST_CIDS bound it. When that would take
    all that is left, it is left to a likelier holder (:func:`preferred`) if there is one: []
    then. CIDs the holder lacks are skipped and stay at the front.
    """
    holders = list(holders)
    workers = max(1, limits.MAX_IN_FLIGHT_PER_HOLDER * sum(1 for h in holders if h.dropped is None))
    most = holder.batch_bytes()
    left = 0  # what is left, as far as it can matter: past workers x most, share >= most
    for cid in itertools.islice(pending, workers * limits.MAX_REQUEST_CIDS):
        left += size(cid)
        if left >= workers * most:
            break
    budget = min(most, max(limits.MIN_SPLIT_BYTES, -(-left // workers)))
    likelier = preferred(pending, holders, holder, slot)
    popped: list[CID] = []  # in queue order, taken or skipped
    batch: list[CID] = []
    taken = 0
    while pending and len(batch) < limits.MAX_REQUEST_CIDS and taken < budget:
        cid = pending.popleft()
        popped.append(cid)
        if cid not in holder.lacks:
            batch.append(cid)
            taken += size(cid)
    if likelier is not None and not pending:
        pending.extend(popped)  # all that is left is one request: the likelier holder's
        return []
    pending.extendleft(reversed([c for c in popped if c in holder.lacks]))
    return batch


def preferred(
    pending: collections.deque[CID],
    holders: Iterable[HolderState],
    holder: HolderState,
    slot: Callable[[str], trio.Semaphore],
) -> HolderState | None:
    """A live holder named before ``holder`` (in the caller's order: the likeliest first) that
    could take the head of ``pending`` now: it does not lack it, has not shown itself slower
    than ``holder`` (a trickler is not handed the end of a fetch), and has a free worker and a
    free ``slot``. None when there is none, or nothing is pending."""
    if not pending:
        return None
    head = pending[0]
    for other in holders:
        if other is holder:
            return None
        if (
            other.dropped is None
            and head not in other.lacks
            and other.rate() >= holder.rate()
            and other.in_flight < limits.MAX_IN_FLIGHT_PER_HOLDER
            and slot(other.peer).value > 0
        ):
            return other
    return None


def needs_another_holder(
    pending: collections.deque[CID],
    active: Iterable[HolderState],
    size: Callable[[CID], int],
) -> bool:
    """Whether the fetch should put the next holder named to work (specs/blocks.md 12a): no
    live holder at work can take the head of ``pending`` (each lacks it, or none is left), or
    fewer are at work than what is left needs: one per MAX_IN_FLIGHT_PER_HOLDER x
    MIN_SPLIT_BYTES of it (the split rule of :func:`take_batch`; never more than one per block),
    plus HEDGE_HOLDERS to take over a slow one's work in the end game."""
    if not pending:
        return False
    live = [h for h in active if h.dropped is None]
    if all(pending[0] in h.lacks for h in live):
        return True
    splitting = len(live) - limits.HEDGE_HOLDERS  # holders at work beside the hedge
    if splitting >= len(pending):
        return False  # no more holders than blocks (a block of unknown size counts as 1 MiB)
    enough = splitting * limits.MAX_IN_FLIGHT_PER_HOLDER * limits.MIN_SPLIT_BYTES
    left = 0
    for cid in itertools.islice(pending, len(live) * limits.MAX_REQUEST_CIDS + 1):
        left += size(cid)
        if left > enough:
            return True
    return False


async def take_slot(slot: trio.Semaphore) -> None:
    """Acquire a holder's ``slot`` before taking work for it; a free one without a checkpoint.

    In a checkpoint between the two, another holder's worker would see this holder's slot gone
    and nothing asked of it yet, and take the work :func:`preferred` leaves to this one.
    """
    try:
        slot.acquire_nowait()
    except trio.WouldBlock:
        await slot.acquire()
