import pytest

from cnode.auth import ReplayError, ReplayGuard

A = "12D3KooWA"
B = "12D3KooWB"


def test_counter_monotonic() -> None:
    guard = ReplayGuard()
    guard.check(A, "run", 1)
    guard.check(A, "run", 5)
    with pytest.raises(ReplayError, match=r"duplicate message from 12D3KooWA in run 'run'"):
        guard.check(A, "run", 5)
    with pytest.raises(ReplayError, match=r"stale message .* counter 3 is older than 5"):
        guard.check(A, "run", 3)
    assert guard.highest(A, "run") == 5  # refused values are not recorded
    guard.check(A, "run", 6)


def test_counters_are_per_signer_and_run() -> None:
    guard = ReplayGuard()
    guard.check(A, "run", 1)
    guard.check(B, "run", 1)
    guard.check(A, "other", 1)
    with pytest.raises(ReplayError):
        guard.check(B, "run", 1)


def test_round_kind() -> None:
    guard = ReplayGuard()
    guard.check_round(A, "run", 4, "update")
    guard.check_round(A, "run", 4, "ready")  # another kind, same round: fine
    with pytest.raises(ReplayError, match=r"duplicate update message .* round 4"):
        guard.check_round(A, "run", 4, "update")
    with pytest.raises(ReplayError, match=r"stale update message .* round 2 is older than 4"):
        guard.check_round(A, "run", 2, "update")
    guard.check_round(A, "run", 5, "update")
    assert guard.highest(A, "run", "update") == 5


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_bad_counter_values(bad: object) -> None:
    with pytest.raises(ReplayError, match="must be a non-negative integer"):
        ReplayGuard().check(A, "run", bad)  # type: ignore[arg-type]


def test_memory_bounded_lru() -> None:
    guard = ReplayGuard(max_keys=2)
    guard.check(A, "r1", 1)
    guard.check(A, "r2", 1)
    guard.check(A, "r1", 2)  # r1 is now most recent
    guard.check(A, "r3", 1)  # evicts r2
    assert len(guard) == 2
    assert guard.highest(A, "r2") is None
    assert guard.highest(A, "r1") == 2
