"""Deadlines that follow the swarm (specs/coordinator.md#pace).

A round phase (score records, `collected` reports, `checked` reports) has a nominal deadline from
the run config. On the internet members are slow, loaded and late as a rule, so a fixed deadline
would let who was on time change what the round decides: an update left out, a ban missed. Past
the nominal deadline, a phase whose members have not all reported closes by what the round has
measured:

- once a strict majority has reported, the median member's time for the phase is known, and the
  phase stays open until ``PACE_FACTOR`` times that time after its start (never before the
  nominal deadline): a straggler gets twice what the median member needed;
- without a majority, it waits for one;
- and never past the nominal deadline plus the phase's ``late_max`` (a named limit), so a swarm
  that is gone cannot hold a round forever.

Everything here is a pure function of times the coordinator recorded, so a restart on the same
database reaches the same verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import limits

__all__ = ["median_time", "phase_closes_at"]


def median_time(start: float, done_at: Sequence[float], total: int) -> float | None:
    """The median member's time for a phase that started at ``start``: the ⌈total/2⌉-th
    report's time after ``start``, known once that many of ``total`` members reported (later
    reports never change it: they come later)."""
    k = (total + 1) // 2
    if total < 1 or len(done_at) < k:
        return None
    return max(sorted(done_at)[k - 1] - start, 0.0)


def phase_closes_at(
    start: float, nominal: float, done_at: Sequence[float], total: int, late_max: float
) -> float:
    """When a phase of ``total`` members closes, given the report times ``done_at`` so far.

    All reported: at the last report (however early). Else never before ``nominal`` nor after
    ``nominal + late_max``; in between, with a strict majority reported, at ``start +
    PACE_FACTOR x`` the median member's time, and without one not at all (until ``late_max``).
    The answer only moves earlier as reports come in, so "closed" never turns back to "open".
    """
    cap = nominal + late_max
    if total <= len(done_at):
        return min(max(done_at, default=start), cap)
    if 2 * len(done_at) <= total:
        return cap
    median = median_time(start, done_at, total)
    assert median is not None  # a strict majority holds at least ceil(total / 2) reports
    return min(max(nominal, start + limits.PACE_FACTOR * median), cap)
