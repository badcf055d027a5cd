"""When a partitioned round's phases close: score records, the result window and its backup
steps, the verify phase. Each time follows the round's measured pace (``_pace.py``): a loaded
machine or slow link delays a phase, it does not change its outcome. Pure: functions of the
round's facts (specs/coordinator.md#pace).
"""

from __future__ import annotations

from .. import limits
from .._config import RunConfig
from .._pace import median_time, phase_closes_at
from .._store._facts import RoundFacts
from .._store._rows import RoundRow
from .._wire._protocol import RoundStatus

__all__ = ["PartitionClock", "listed_row", "set_time"]


class PartitionClock:
    """The phase times of one run's partitioned rounds."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def scores_closed(self, f: RoundFacts, now: float) -> bool:
        """No score record is taken any more: the round is agreed, or its score phase closed
        (specs/coordinator.md#scores-in-partitioned-rounds); False for a round not listed. The
        verdict only moves from open to closed: ``now`` grows, and records are only added while
        open."""
        if f.row is None or not f.row.listed:
            return False
        if f.row.status is RoundStatus.AGREED:
            return True
        at = self.scores_close_at(f)
        return at is not None and now >= at

    def scores_close_at(self, f: RoundFacts) -> float | None:
        """When a published partitioned round's score records close: once every member sent
        one, else by the pace rule (_pace.py) from the nominal score deadline,
        SCORE_CLOSE_MARGIN_S before the collect deadline (or a quarter of the collect window
        before it, when that is shorter): the moment aggregators stop fetching. A loaded
        machine or slow link delays the scores (and the ban they may carry), it does not
        change them."""
        row = listed_row(f)
        end, start = row.collect_deadline, row.published_at
        if end is None or start is None:
            return None
        window = end - start
        nominal = end - min(limits.SCORE_CLOSE_MARGIN_S, window / 4)
        members = row.members
        times = f.report_times("scored_at", members)
        late = min(self.config.rounds.late_max_s, limits.SCORE_CLOSE_MAX_S)
        return phase_closes_at(start, nominal, times, len(members), late)

    def results_open_at(self, f: RoundFacts) -> float:
        """When the round's result window opens: at the collect deadline, or when the score
        records close if that is later (every aggregator waits for them)."""
        opens = set_time(listed_row(f).collect_deadline)
        closes = self.scores_close_at(f) if self.config.scored else None
        if closes is not None:
            opens = max(opens, closes)
        return opens

    def backup_step(self, f: RoundFacts) -> float:
        """The round's backup step: rounds.backup_step_s, or the median member's time to score
        when longer (publish -> score record: fetching and scoring two updates; a partition is
        about one update to fetch and aggregate), at most BACKUP_STEP_MAX_S."""
        step = self.config.rounds.backup_step_s
        row = listed_row(f)
        if self.config.scored:
            members = row.members
            times = f.report_times("scored_at", members)
            median = median_time(set_time(row.published_at), times, len(members))
            if median is not None:
                step = max(step, min(median, limits.BACKUP_STEP_MAX_S))
        return step

    def due(self, f: RoundFacts) -> list[float]:
        """When a published partitioned round next has something to do without a request."""
        row = listed_row(f)
        if row.verify_deadline is not None:
            return [self.verify_closes_at(f)]
        if row.results_open is None:
            return [self.results_open_at(f)]
        steps = min(row.backup_steps, limits.MAX_PARTITION_BACKUPS) + 1
        return [row.results_open + steps * set_time(row.backup_step)]

    def verify_closes_at(self, f: RoundFacts) -> float:
        """When the round is agreed without the members that have not reported `checked`: by
        the pace rule from the verify deadline (the phase started when every result was in)."""
        row = listed_row(f)
        deadline = set_time(row.verify_deadline)
        voters = [p for p in row.members if p not in f.banned]
        times = f.report_times("checked_at", voters)
        start = deadline - self.config.rounds.verify_timeout_s
        late = self.config.rounds.late_max_s
        return phase_closes_at(start, deadline, times, len(voters), late)


def set_time(at: float | None) -> float:
    """A time the round's status guarantees is set (a published round's publish time and
    collect deadline; a backup step once the result window opened)."""
    assert at is not None, "set by the transition that entered this status"
    return at


def listed_row(f: RoundFacts) -> RoundRow:
    """The row of a round the caller knows is listed."""
    assert f.row is not None, "a listed round has a row"
    return f.row
