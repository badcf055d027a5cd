"""KnownBans: the signed state's bans, replaced whole; a ban of this node ends its run."""

from __future__ import annotations

import pytest

from cnode.node.coordinator import BanKind, BanRecord
from cnode.node.train import BannedError
from cnode.node.train.swarm._bans import KnownBans


def _ban(peer: str, reason: str = "outlier in 3 of the last 3 rounds") -> BanRecord:
    return BanRecord(peer, "", BanKind.MAJORITY, reason, 3, "12D3KooWreporter", 0)


def test_bans_are_replaced_whole_and_new_ones_reported() -> None:
    bans = KnownBans()
    assert bans.take([_ban("a"), _ban("b")]) == ["a", "b"]
    assert "a" in bans and "c" not in bans
    assert bans.take([_ban("b"), _ban("c")]) == ["c"]  # an unban (a) is taken too
    assert bans.peers() == {"b", "c"}


def test_a_ban_of_this_node_raises_with_the_coordinators_reason() -> None:
    bans = KnownBans()
    bans.take([_ban("other")])
    bans.check_not_banned("me", "run-a")
    bans.take([_ban("me", "sent NaN in round 4")])
    with pytest.raises(BannedError) as err:
        bans.check_not_banned("me", "run-a")
    assert err.value.kind is BanKind.MAJORITY
    assert str(err.value) == (
        "the coordinator banned this node from run 'run-a' (a majority of the round's other "
        "members (last report of …reporter)): sent NaN in round 4"
    )
