"""The swarm queue of ``make test`` (tests/conftest.py) names real modules and misses no swarm."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ONE_SWARM_AT_A_TIME

ROOT = Path(__file__).resolve().parent.parent


def test_every_queued_module_exists() -> None:
    missing = sorted(m for m in ONE_SWARM_AT_A_TIME if not (ROOT / m).is_file())
    assert not missing, f"tests/conftest.py queues modules that do not exist: {missing}"


def test_every_module_that_starts_a_swarm_is_queued() -> None:
    starts_swarm = re.compile(r"\bSwarm\(|\bNetbed\(")
    swarms = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if starts_swarm.search(p.read_text())
    }
    assert swarms, "no swarm test found: the pattern is out of date"
    unqueued = sorted(swarms - ONE_SWARM_AT_A_TIME)
    assert not unqueued, f"add these to ONE_SWARM_AT_A_TIME in tests/conftest.py: {unqueued}"
