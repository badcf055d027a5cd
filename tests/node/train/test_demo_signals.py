"""Nothing left behind: a ``cnode demo`` ended by SIGTERM, or killed outright with SIGKILL,
takes its coordinator and node processes with it (node/_children.py). A real demo process,
its real children; ~20-40 s each on a loaded 2-core machine (most of it the children's
imports)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

START_S = 120.0  # the coordinator listening and every node process started, loaded machine
END_S = 30.0  # every child gone after the demo ends (nodes leave their round on SIGTERM)


def _started_demo(work: Path) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    demo = subprocess.Popen(
        [sys.executable, "-m", "cnode", "demo", "--workdir", str(work), "--rounds", "3",
         "--late-after", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    ready = work / "coordinator.ready.json"
    give_up = time.monotonic() + START_S
    children: list[psutil.Process] = []
    while time.monotonic() < give_up:
        assert demo.poll() is None, "the demo ended before it was signalled"
        children = psutil.Process(demo.pid).children(recursive=True)
        if ready.exists() and len(children) >= 7:  # the coordinator and six nodes
            break
        time.sleep(0.2)
    else:
        demo.kill()
        pytest.fail(f"the demo did not start its processes in {START_S:g} s")
    coordinator = json.loads(ready.read_text())["pid"]
    assert coordinator in {c.pid for c in children}
    return demo, children


def _all_gone(children: list[psutil.Process]) -> list[int]:
    _, alive = psutil.wait_procs(children, timeout=END_S)
    for proc in alive:  # do not leave them behind even when the test fails
        proc.kill()
    return [p.pid for p in alive]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_demo_leaves_no_process_behind(tmp_path: Path, signum: int) -> None:
    demo, children = _started_demo(tmp_path / "demo")
    os.kill(demo.pid, signum)
    demo.wait(timeout=END_S)
    assert _all_gone(children) == []
