"""A training node imports the coordinator's client side only: never its HTTP server, state
machine or SQLite store (those are cnode.node.coordinator.server). (sqlite3 itself is loaded by
third-party imports, so the check is on our modules.)"""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_SIDE = (
    "cnode.node.coordinator._http._server",
    "cnode.node.coordinator._rounds._machine",
    "cnode.node.coordinator._store._store",
    "cnode.node.coordinator._process",
    "cnode.node.coordinator.server",
)


def _modules_after(code: str) -> set[str]:
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_training_node_imports_no_server_side() -> None:
    loaded = _modules_after("import cnode.node.train, cnode.node.coordinator")
    assert not loaded & set(SERVER_SIDE)


def test_the_server_side_is_one_import_away() -> None:
    loaded = _modules_after("from cnode.node.coordinator.server import CoordinatorServer")
    assert set(SERVER_SIDE) <= loaded
