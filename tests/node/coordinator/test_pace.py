"""The pace rule: deadlines that follow the swarm (specs/coordinator.md#pace, ``_pace.py``)."""

from __future__ import annotations

import pytest

from cnode.node.coordinator import limits
from cnode.node.coordinator._pace import median_time, phase_closes_at

# A phase that started at 100 s with a nominal deadline at 110 s and a late bound of 60 s.
START, NOMINAL, LATE = 100.0, 110.0, 60.0


def closes(done: list[float], total: int) -> float:
    return phase_closes_at(START, NOMINAL, done, total, LATE)


def test_everyone_reported_closes_at_the_last_report_even_before_the_nominal_deadline() -> None:
    assert closes([101.0, 103.0, 102.0], 3) == 103.0


def test_a_quick_majority_closes_at_the_nominal_deadline_not_before() -> None:
    # The median member needed 2 s: twice that is still before the nominal deadline.
    assert closes([101.0, 102.0], 3) == NOMINAL


def test_a_slow_majority_keeps_the_phase_open_for_twice_the_median_members_time() -> None:
    # Loaded machines: the median member (the 2nd of 3 or 4) needed 8-9 s: the stragglers get
    # twice that, past the nominal deadline.
    assert median_time(START, [108.0, 109.0, 104.0], 4) == 8.0
    assert closes([108.0, 109.0, 104.0], 4) == START + limits.PACE_FACTOR * 8.0
    assert closes([107.0, 109.0], 3) == START + limits.PACE_FACTOR * 9.0


def test_without_a_majority_the_phase_waits_up_to_the_late_bound() -> None:
    assert closes([], 3) == NOMINAL + LATE
    assert closes([105.0], 2) == NOMINAL + LATE  # one of two is no strict majority
    assert closes([105.0, 106.0], 4) == NOMINAL + LATE


def test_no_pace_keeps_a_phase_open_past_the_late_bound() -> None:
    assert closes([150.0, 160.0], 3) == NOMINAL + LATE
    assert closes([120.0, 200.0, 300.0], 3) == NOMINAL + LATE


@pytest.mark.parametrize("total", [1, 2, 3, 4, 5, 8, 9])
def test_the_close_only_moves_earlier_as_reports_come_in(total: int) -> None:
    # Reports arrive in time order; "closed" must never turn back to "open".
    arrivals = [START + 3.0 * (i + 1) for i in range(total)]
    seen = [closes([], total)]
    for i in range(total):
        seen.append(closes(arrivals[: i + 1], total))
    assert seen == sorted(seen, reverse=True), seen


def test_the_median_is_unknown_until_half_reported() -> None:
    assert median_time(START, [101.0], 3) is None
    assert median_time(START, [101.0, 102.0], 3) == 2.0
    assert median_time(START, [], 0) is None
