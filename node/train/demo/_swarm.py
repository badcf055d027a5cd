"""What ``cnode demo`` runs, and its processes: shared by the demo and its report."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from cnode.node._new_run import NEW_RUN_CODEC

__all__ = ["DemoSettings"]


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs."""

    workdir: Path | None = None  # keep everything here (default: a temporary folder, removed)
    rounds: int = 8  # rounds of the run
    honest: int = 4  # honest nodes started at once
    late_after_round: int = 3  # the late joiner starts when this round is aggregated
    attack: str = "gaussian"  # what the attacker sends (aggregation's attack harness)
    timeout_s: float = 600.0  # the whole demo gives up after this
    # The run's training.update_codec, with the keys a new run gets for it (new_run_training).
    codec: str = NEW_RUN_CODEC
    training: dict[str, Any] = field(default_factory=dict)  # [training] table overrides


class Role(StrEnum):
    """A demo node's part (shown in its status table)."""

    HONEST = "honest"
    ATTACKER = "attacker"  # sends the demo's attack
    LATE_JOINER = "late joiner"  # joins after DemoSettings.late_after_round


@dataclass
class _Proc:
    """One node process of the demo: who it is, where its home is, and its process."""

    name: str
    role: Role
    home: Path
    peer: str
    port: int
    metrics_port: int  # its Prometheus metrics: http://127.0.0.1:PORT/metrics
    popen: subprocess.Popen[bytes] | None = None

    @property
    def report(self) -> Path:
        return self.home / "report.jsonl"

    @property
    def node_log(self) -> Path:
        return self.home / "node.log"
