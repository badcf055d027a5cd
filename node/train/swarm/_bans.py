"""The bans of a run as this node last saw them in the coordinator's signed state."""

from __future__ import annotations

from collections.abc import Sequence

from cnode.node.coordinator import BanRecord

from .._exceptions import BannedError

__all__ = ["KnownBans"]


class KnownBans:
    """Banned peer ids and the coordinator's ban records; replaced whole by each signed state read.

    The block server, the header validator and the catch-up all consult it, so a ban learned
    from gossip or a poll takes effect everywhere at once.
    """

    def __init__(self) -> None:
        self._bans: dict[str, BanRecord] = {}

    def __contains__(self, peer: object) -> bool:
        return peer in self._bans

    def peers(self) -> set[str]:
        return set(self._bans)

    def take(self, bans: Sequence[BanRecord]) -> list[str]:
        """Replace the known bans with ``bans``; return the peers banned since the last take."""
        new = sorted({b.peer for b in bans} - set(self._bans))
        self._bans = {b.peer: b for b in bans}
        return new

    def check_not_banned(self, peer: str, run: str) -> None:
        """Raise BannedError if ``peer`` (this node) is banned; its peers refuse it from now on."""
        ban = self._bans.get(peer)
        if ban is not None:
            raise BannedError(
                f"the coordinator banned this node from run {run!r} ({ban.decided_by()}): "
                f"{ban.reason}",
                ban.kind,
            )
