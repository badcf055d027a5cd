"""What the rules read: the rows of the rounds in play, gathered by the store in one read.

:class:`RunFacts` holds the run row, the latest checkpoint and, per round the rules may touch
(the current round, the next one, every published round, and any round a request names), a
:class:`RoundFacts`: its row, its members' rows, its partition results and which of its
members are banned. The rules derive everything else from these (who reported, when, whose
header stands), so they run on values a test writes by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .._wire._protocol import RoundStatus
from ._rows import CheckpointRow, MemberRow, MemberStatus, ResultRow, RoundRow, RunRow

__all__ = ["RoundFacts", "RunFacts", "SameEvidence"]

# The members' report times (_pace.py reads them): collected, scored, checked.
REPORT_TIMES = ("collected_at", "scored_at", "checked_at")


@dataclass(frozen=True)
class RoundFacts:
    """One round as the rules see it (``row`` is None for a round not opened yet, which may
    have members already: joiners of the next round)."""

    row: RoundRow | None
    members: Mapping[str, MemberRow] = field(default_factory=dict)  # every member row, by peer
    results: Mapping[int, ResultRow] = field(default_factory=dict)  # partition -> result
    banned: frozenset[str] = frozenset()  # the peers of ``members`` that are banned now
    # The peers of ``members`` whose last join was dialed back (specs/coordinator.md#reachability)
    public: frozenset[str] = frozenset()

    def peers(self, *statuses: MemberStatus) -> list[str]:
        """The members with one of ``statuses``, by peer id."""
        return sorted(p for p, m in self.members.items() if m.status in statuses)

    def count(self, *statuses: MemberStatus) -> int:
        return sum(1 for m in self.members.values() if m.status in statuses)

    def headers(self) -> dict[str, str]:
        """The ready members' update headers."""
        return {
            p: m.header
            for p, m in sorted(self.members.items())
            if m.status is MemberStatus.READY and m.header is not None
        }

    def listed_headers(self) -> dict[str, str]:
        """The published members' headers, whatever their status since (a banned member's
        stays)."""
        listed = set(self.row.members if self.row is not None else ())
        return {
            p: m.header
            for p, m in sorted(self.members.items())
            if p in listed and m.header is not None
        }

    def collected(self) -> dict[str, list[str]]:
        """The `collected` reports: member -> the members whose update it lacks."""
        return {p: m.missing for p, m in self.members.items() if m.missing is not None}

    def checked(self) -> dict[str, list[int]]:
        """The `checked` reports: member -> the partitions it found wrong."""
        return {p: m.checked for p, m in self.members.items() if m.checked is not None}

    def score_records(self) -> dict[str, str]:
        """The recorded score records: member -> record CID."""
        return {
            p: m.score_record for p, m in sorted(self.members.items()) if m.score_record is not None
        }

    def report_times(self, column: str, members: list[str]) -> list[float]:
        """When each of ``members`` made a phase's report (``column``: one of REPORT_TIMES);
        those that reported only."""
        if column not in REPORT_TIMES:
            raise ValueError(f"{column!r} is not a report time")
        out = []
        for peer in members:
            m = self.members.get(peer)
            at = None if m is None else getattr(m, column)
            if at is not None:
                out.append(float(at))
        return out


@dataclass(frozen=True)
class RunFacts:
    """The run as the rules see it."""

    run: RunRow
    rounds: Mapping[int, RoundFacts]  # the rounds in play (see the module docstring)
    latest_checkpoint: CheckpointRow | None = None

    def round(self, n: int) -> RoundFacts:
        """Round ``n``'s facts (its row None and no member when it has neither)."""
        if n not in self.rounds:
            raise KeyError(f"round {n} was not read (Store.facts reads the rounds in play)")
        return self.rounds[n]

    @property
    def current(self) -> RoundRow:
        row = self.round(self.run.round).row
        assert row is not None, "the current round always has a row"
        return row

    def published(self) -> list[RoundFacts]:
        """The published rounds (listed, not agreed yet), oldest first."""
        return [
            f
            for _n, f in sorted(self.rounds.items())
            if f.row is not None and f.row.status is RoundStatus.PUBLISHED
        ]


@dataclass(frozen=True)
class SameEvidence:
    """Which earlier reports count with a new one (the store answers with their reporters).

    Outlier reports about ``accused`` in rounds first..last (members that joined at different
    rounds reach "k of the last m rounds" at different rounds: they add up over the window), or
    reports of the same ``kind`` about the same update (``update_cid``) of round ``last``."""

    accused: str
    kind: str
    first: int
    last: int
    update_cid: str | None
    window: bool  # True: any update in first..last; False: this update of round `last`
