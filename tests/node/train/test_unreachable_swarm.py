"""The README's three-node flow without ``--allow-private-addrs`` (issue 23): every node's
loopback address is refused, so nobody can dial anybody. Each node says so at join, naming its
address, why and the fix, and stops with reason ``unreachable`` naming the round's other
members, within 180 s; none stops on a checkpoint mismatch. Real processes; ~60 s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cnode.node.train import StopReason

from .swarm import Swarm

pytestmark = pytest.mark.slow


def test_nodes_nobody_can_dial_stop_unreachable_naming_each_other(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    swarm = Swarm(
        tmp_path,
        ["a", "b", "c"],
        min_participants=3,
        training={"partitioned": "always"},
        collect_timeout_s=8.0,
        backup_step_s=2.0,
        allow_private_addrs=False,
    )
    swarms.append(swarm)
    began = time.monotonic()
    nodes = [swarm.start(n, rounds=3, checkpointer=True) for n in "abc"]
    for node in nodes:
        assert swarm.wait_exit(node, timeout=180) == StopReason.UNREACHABLE.exit_code, (
            swarm.describe()
        )
    assert time.monotonic() - began < 180
    for node in nodes:
        (stopped,) = node.events("stopped")
        assert stopped["stop_reason"] == "unreachable", stopped
        others = [n.peer for n in nodes if n is not node]
        assert all(p in stopped["reason"] for p in others), stopped
        assert "mismatch" not in stopped["reason"] and "differs" not in stopped["reason"]
        log = node.log.read_text()
        assert "unreachable_at_join" in log and "--announce-addr" in log, log[-2000:]
        assert "private or loopback address" in log
