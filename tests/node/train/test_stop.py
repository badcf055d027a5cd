"""Every way a node stops maps to one reason of the closed set (specs/training.md
#why-a-node-stops). Paths driven end to end are in test_cli.py (configuration, coordinator),
test_swarm.py / test_partitioned_swarm.py (banned, finished), test_netbed.py (unreachable);
here each error the loop can raise is classified, with its exit status."""

from __future__ import annotations

import errno

import pytest

from cnode.auth import AuthError
from cnode.node.coordinator import BanKind, CoordinatorRejected, CoordinatorUnavailable
from cnode.node.hub import HubLoginError
from cnode.node.p2p import FetchError
from cnode.node.train import (
    BannedError,
    CatchUpError,
    MissingUpdatesError,
    NodeStopped,
    ReplayMismatchError,
    RoundStalledError,
    StateMismatchError,
    StopReason,
    TrainingConfigError,
    UnreachableError,
    stop_reason_of,
)
from cnode.storage import CID, RAW, BlockNotFoundError, compute_cid

CASES = [
    (None, StopReason.FINISHED),
    (BannedError("peer x is banned: outlier", BanKind.MAJORITY), StopReason.BANNED),
    (CoordinatorRejected(403, "banned", "peer x is banned"), StopReason.BANNED),
    (UnreachableError(1, {"12D3KooWa": "no address"}), StopReason.UNREACHABLE),
    (CatchUpError("no holder served the checkpoint"), StopReason.UNREACHABLE),
    (MissingUpdatesError(2, ["p"], {"p": "timed out"}), StopReason.UNREACHABLE),
    (FetchError("no holder answered", missing=1, fetched=0), StopReason.UNREACHABLE),
    (CoordinatorUnavailable("cannot reach the coordinator"), StopReason.COORDINATOR),
    (CoordinatorRejected(503, "down", "restarting"), StopReason.COORDINATOR),
    (RoundStalledError("no member list after 600 s"), StopReason.COORDINATOR),
    (TrainingConfigError("n_embd"), StopReason.CONFIGURATION),
    (CoordinatorRejected(403, "not_allowed", "not allowlisted"), StopReason.CONFIGURATION),
    (AuthError("bad identity file"), StopReason.CONFIGURATION),
    (HubLoginError("hf_token readable by others"), StopReason.CONFIGURATION),
    (OSError(errno.ENOSPC, "No space left on device"), StopReason.DISK),
    (StateMismatchError("round 3: state differs"), StopReason.DIVERGED),
    (ReplayMismatchError("layer h.0 differs"), StopReason.DIVERGED),
    (ZeroDivisionError("a bug"), StopReason.INTERNAL),
]


@pytest.mark.parametrize(("error", "reason"), CASES, ids=[r.value + str(i) for i, (_, r) in
                                                          enumerate(CASES)])  # fmt: skip
def test_each_error_has_its_reason(error: BaseException | None, reason: StopReason) -> None:
    assert stop_reason_of(error) is reason
    assert stop_reason_of(NodeStopped(reason, "evidence")) is reason


def test_a_missing_block_of_our_own_store_is_a_disk_stop_naming_the_block() -> None:
    cid: CID = compute_cid(b"x", RAW)
    error = BlockNotFoundError(f"block {cid} is not in the store")
    assert stop_reason_of(error) is StopReason.DISK
    assert str(cid) in str(NodeStopped(StopReason.DISK, str(error)))


def test_exit_codes_are_distinct_and_finished_is_zero() -> None:
    codes = [r.exit_code for r in StopReason]
    assert len(set(codes)) == len(codes) and StopReason.FINISHED.exit_code == 0
    assert StopReason.CONFIGURATION.exit_code not in (1, 2)  # not a usage error nor a bug
