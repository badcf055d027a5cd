"""How ``make test`` shares the suite between its two pytest-xdist workers.

A swarm test starts a coordinator and several ``cnode train`` processes whose rounds run to
deadlines; two of them at once on a 2-core machine starve each other's rounds. So the modules in
:data:`ONE_SWARM_AT_A_TIME` form one queue that a single worker runs in order (the longest queue,
so it starts first), while the other worker runs everything else. The netbed module belongs there
for a second reason: its network namespaces (cb0.., cbhub) have machine-wide names.

The queue is chosen by module path because the scheduler sees node ids only (pytest-xdist's own
``xdist_group`` mark rewrites node ids, which pytest 9.2 no longer lets it do).
"""

from __future__ import annotations

from typing import Any

import pytest

ONE_SWARM_AT_A_TIME = frozenset(
    f"tests/node/train/{name}.py"
    for name in (
        "test_busy_holder_swarm",
        "test_dataset_swarm",
        "test_faults",
        "test_gateway_catch_up",
        "test_hub_fallback",
        "test_late_join",
        "test_nat_swarm",
        "test_netbed",
        "test_partitioned_swarm",
        "test_rejected_swarm",
        "test_score_edges_swarm",
        "test_scored_swarm",
        "test_swarm",
        "test_twelve_swarm",
        "test_unreachable_swarm",
        "test_user_flow",
    )
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: the swarm modules in one queue, every other test on its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SwarmQueue(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "swarms" if module in ONE_SWARM_AT_A_TIME else nodeid

    return SwarmQueue(config, log)
