"""This node's reachability and the round's: said once at join, and a round nobody can be
dialed in is stopped at once (specs/training.md#reachability).

The coordinator dials back the addresses a node advertises at join (specs/coordinator.md
#reachability) and hands out only those it reached. A node none of whose addresses answered is
``outbound-only``: it dials the public members itself, and they fetch its blocks over the
connections it opened; nobody is told to dial it. A round whose members are all outbound-only
cannot exchange anything (no connection can be opened between two of them), so it is refused at
once with the fix instead of timing out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog

from cnode.node.p2p import P2PNode

from .._exceptions import NoPublicMemberError

__all__ = ["check_round_reachable", "note_reachability", "public_members", "say_reachability"]

log = structlog.get_logger(__name__)

FIX_OUTBOUND_ONLY = (
    "none needed to train: this node dials the public members and its blocks leave over those "
    "connections. To serve other outbound-only members too, open or forward its libp2p port "
    "(--listen) and pass --announce-addr with the public address"
)


def say_reachability(
    reachability: str, advertised: Sequence[str], reachable: Sequence[str]
) -> None:
    """Log once what the coordinator's dial-back found, and the fix when there is one."""
    if reachability == "public":
        log.info("reachability", reachability=reachability, reachable=list(reachable))
        return
    log.warning(
        "reachability",
        reachability=reachability,
        advertised=list(advertised),
        why="the coordinator could not dial any advertised address back"
        if advertised
        else "this node advertised no address",
        fix=FIX_OUTBOUND_ONLY,
    )


def public_members(members: Sequence[str], addrs: Mapping[str, Sequence[str]]) -> list[str]:
    """The members the coordinator lists with a dialed-back address."""
    return [m for m in members if addrs.get(m)]


def check_round_reachable(
    round_: int, me: str, members: Sequence[str], addrs: Mapping[str, Sequence[str]]
) -> None:
    """Raise :class:`NoPublicMemberError` when the round has other members and none of its
    members (this node included) can be dialed: no two of them could ever connect."""
    others = [m for m in members if m != me]
    if others and not public_members(members, addrs):
        raise NoPublicMemberError(round_, others)


def note_reachability(
    node: P2PNode, members: Sequence[str], addrs: Mapping[str, Sequence[str]]
) -> None:
    """Tell the p2p node which listed members are outbound-only (listed without an address):
    its fetches then never dial them, and reach them only over connections they opened."""
    public = set(public_members(members, addrs))
    node.reach.mark_outbound_only(set(members) - public - {node.peer_id}, public)
