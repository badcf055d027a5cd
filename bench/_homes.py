"""Node homes, processes and reports for benches that run real `cnode train` processes (soak,
swarm size, round)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomli_w

from cnode.auth import Identity, save_identity
from cnode.node.coordinator.server import CoordinatorProcess

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


def run_config(run: str, coordinator: str, peers: list[str], training: dict[str, Any],
               collect_timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """A run config for a bench swarm: every listed peer a member, a checkpoint each round."""
    return {
        "run": run,
        "coordinator": coordinator,
        "rounds": {
            "min_participants": len(peers),
            "round_timeout_s": 600.0,
            "checkpoint_every": 1,
            "cooldown_s": 120.0,
            "warmup_s": 2.0,
            "collect_timeout_s": collect_timeout_s,
        },
        "access": {"peers": peers},
        "network": {"allow_private_addrs": True},
        "training": training,
    }


def start_coordinator(work: Path, run: str, peers: list[str], training: dict[str, Any],
                      collect_timeout_s: float) -> CoordinatorProcess:  # fmt: skip
    """A new coordinator key in ``work``, the run config (``run_config``) as ``work``/run.toml,
    and its coordinator started on them."""
    key = Identity.generate()
    save_identity(key, work / "coordinator.key")
    config = run_config(run, key.peer_id_str, peers, training, collect_timeout_s)
    (work / "run.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
    return CoordinatorProcess(
        work / "run.toml", work / "coordinator.db", work / "coordinator.key"
    ).start()


def start_nodes(
    homes: list[Path],
    run: str,
    run_toml: Path,
    coordinator_url: str,
    rounds: int,
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """One `cnode train` per home (the first is the checkpointer), each logging to its home;
    ``env`` adds to the nodes' environment."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    procs = []
    for i, home in enumerate(homes):
        cmd = [
            *CNODE, "--log-json", "train", "--run", run, "--run-config", str(run_toml),
            "--home", str(home), "--coordinator", coordinator_url,
            # Any free port, bound by the node itself: a port picked here and bound seconds
            # later (a node's start) was taken meanwhile by another node's outbound connection
            # at 32 members ("already in use"); the nodes learn each other's from the coordinator.
            "--listen", "/ip4/127.0.0.1/tcp/0",
            "--rounds", str(rounds), "--report", str(home / "report.jsonl"),
        ]  # fmt: skip
        if i == 0:
            cmd.append("--checkpointer")
        with (home / "node.log").open("ab") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log))
    return procs


def wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Until every process ends or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(1.0)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM what still runs, then kill what does not stop within 30 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
