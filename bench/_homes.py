"""Node homes and reports for benches that run real `cnode train` processes (soak, swarm size)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CNODE = [sys.executable, "-m", "cnode"]


def init_homes(homes: list[Path]) -> list[str]:
    """Make each home as a user does (`cnode init`, all at once); their peer ids, in order."""
    procs = [
        subprocess.Popen([*CNODE, "init", "--home", str(h)], stdout=subprocess.PIPE, text=True)
        for h in homes
    ]
    peers = []
    for proc in procs:
        text, _ = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"cnode init failed ({proc.returncode}): {text[-300:]}")
        peers.append(next(x.split()[-1] for x in text.splitlines() if x.startswith("peer id:")))
    return peers


def report_events(home: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The events of the node's report (``--report HOME/report.jsonl``), of ``kind`` if given.
    The last line may be half-written while the node runs: it is skipped."""
    report = home / "report.jsonl"
    if not report.exists():
        return []
    lines = report.read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines if line.endswith("}")]
    return [e for e in events if kind is None or e["event"] == kind]
