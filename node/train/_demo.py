"""``cnode demo``: a whole swarm on this machine, and an honest report of what it did.

Processes: one coordinator, four honest nodes (the first is the checkpointer), one attacker
(``--attack``, a testing aid) and one node started late. Each node writes JSON-line events
(_report.py); every figure of the final report is read from those files or from the coordinator's
signed run state. Nothing is simulated: these are the same commands a user runs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from cnode.auth import Identity, save_identity
from cnode.node._config import IDENTITY_FILE, NodeConfig, save_config
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ._exceptions import TrainingError
from ._report import read_report

__all__ = ["DemoSettings", "run_demo"]

RUN_ID = "demo"


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs."""

    workdir: Path | None = None  # keep everything here (default: a temporary folder, removed)
    rounds: int = 8  # rounds of the run
    honest: int = 4  # honest nodes started at once
    late_after_round: int = 3  # the late joiner starts when this round is aggregated
    attack: str = "gaussian"  # what the attacker sends (aggregation's attack harness)
    timeout_s: float = 600.0  # the whole demo gives up after this
    training: dict[str, Any] = field(default_factory=dict)  # [training] table overrides


@dataclass
class _Proc:
    name: str
    role: str
    home: Path
    peer: str
    port: int
    popen: subprocess.Popen[bytes] | None = None

    @property
    def report(self) -> Path:
        return self.home / "report.jsonl"

    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}/p2p/{self.peer}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cnode() -> list[str]:
    return [sys.executable, "-m", "cnode"]


@contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    tmp = Path(tempfile.mkdtemp(prefix="cnode-demo-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    # Six processes share the machine: one torch thread each keeps them from fighting.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _last(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e["event"] == kind), None)


def _status_table(procs: list[_Proc], rounds: int) -> Table:
    table = Table(title=f"cnode demo · run {RUN_ID!r} · {rounds} rounds")
    for col in ("node", "role", "round", "held-out loss", "state CID", "status"):
        table.add_column(col)
    for p in procs:
        events = read_report(p.report)
        last_round = _last(events, "round")
        stopped = _last(events, "stopped")
        if p.popen is None:
            status = "not started"
        elif p.popen.poll() is None:
            status = events[-1]["event"] if events else "starting"
        else:
            status = f"exited {p.popen.returncode}" + (f": {stopped['reason']}" if stopped else "")
        table.add_row(
            p.name,
            p.role,
            str(last_round["round"]) if last_round else "-",
            f"{last_round['loss']:.4f}" if last_round else "-",
            last_round["state_cid"][-12:] if last_round else "-",
            status,
        )
    return table


def run_demo(settings: DemoSettings, console: Console) -> int:
    """Run the swarm, show it live, print the report; 0 when every check held."""
    from ._demo_report import final_report

    with _workdir(settings.workdir) as work:
        procs = _prepare(work, settings)
        coordinator, run_config, coord_url = _coordinator_files(work, procs, settings)
        everything: list[subprocess.Popen[bytes]] = []
        try:
            coord = _start(coordinator, work / "coordinator.log")
            everything.append(coord)
            _wait_http(coord_url, coord, deadline=time.monotonic() + 60)
            first = procs[0]
            late = next(p for p in procs if p.role == "late joiner")
            for p in procs:
                if p is late:
                    continue
                p.popen = _start(
                    _node_cmd(p, run_config, coord_url, first, settings), p.home / "node.log"
                )
                everything.append(p.popen)
            deadline = time.monotonic() + settings.timeout_s
            with Live(
                _status_table(procs, settings.rounds), console=console, refresh_per_second=2
            ) as live:
                while time.monotonic() < deadline:
                    time.sleep(0.5)
                    live.update(_status_table(procs, settings.rounds))
                    done_round = _round_of(first)
                    if late.popen is None and done_round >= settings.late_after_round:
                        late.popen = _start(
                            _node_cmd(late, run_config, coord_url, first, settings),
                            late.home / "node.log",
                        )
                        everything.append(late.popen)
                    honest = [p for p in procs if p.role != "attacker"]
                    if all(p.popen is not None and p.popen.poll() is not None for p in honest):
                        break
                live.update(_status_table(procs, settings.rounds))
            return final_report(work, procs, coord_url, run_config, settings, console)
        finally:
            for proc in reversed(everything):
                _stop(proc)


def _round_of(proc: _Proc) -> int:
    last = _last(read_report(proc.report), "round")
    return int(last["round"]) if last else 0


def _prepare(work: Path, settings: DemoSettings) -> list[_Proc]:
    roles = ["honest"] * settings.honest + ["attacker", "late joiner"]
    names = [f"honest-{i + 1}" for i in range(settings.honest)] + ["attacker", "late"]
    procs = []
    for name, role in zip(names, roles, strict=True):
        home = work / name
        home.mkdir(parents=True, exist_ok=True)
        identity = Identity.generate()
        save_identity(identity, home / IDENTITY_FILE)
        port = _free_port()
        save_config(
            home,
            NodeConfig(listen=f"/ip4/127.0.0.1/tcp/{port}", log_format="json"),
        )
        procs.append(_Proc(name, role, home, identity.peer_id_str, port))
    return procs


def _coordinator_files(
    work: Path, procs: list[_Proc], settings: DemoSettings
) -> tuple[list[str], Path, str]:
    key = Identity.generate()
    key_file = work / "coordinator.key"
    save_identity(key, key_file)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "run": RUN_ID,
        "coordinator": key.peer_id_str,
        "url": url,
        "rounds": {
            "min_participants": settings.honest,
            "round_timeout_s": 60.0,
            "checkpoint_every": 1,
            "cooldown_s": 30.0,
        },
        "access": {
            "peers": [p.peer for p in procs],
            "checkpointers": [procs[0].peer],
        },
        "training": settings.training,
    }
    run_config = work / "run.toml"
    run_config.write_text(tomli_w.dumps(config), encoding="utf-8")
    cmd = [
        *_cnode(),
        "--log-json",
        "coordinator",
        "serve",
        "--run-config",
        str(run_config),
        "--db",
        str(work / "coordinator.db"),
        "--listen",
        f"127.0.0.1:{port}",
        "--key",
        str(key_file),
    ]
    return cmd, run_config, url


def _node_cmd(
    p: _Proc, run_config: Path, url: str, first: _Proc, settings: DemoSettings
) -> list[str]:
    cmd = [
        *_cnode(),
        "--log-json",
        "train",
        "--run",
        RUN_ID,
        "--run-config",
        str(run_config),
        "--home",
        str(p.home),
        "--coordinator",
        url,
        "--rounds",
        str(settings.rounds),
        "--report",
        str(p.report),
    ]
    if p is first:
        cmd.append("--checkpointer")
    else:
        cmd += ["--bootstrap", first.addr()]
    if p.role == "attacker":
        cmd += ["--attack", settings.attack]
    return cmd


def _wait_http(url: str, proc: subprocess.Popen[bytes], *, deadline: float) -> None:
    import httpx

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrainingError(f"the coordinator exited with status {proc.returncode}")
        try:
            httpx.get(url + "/", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise TrainingError("the coordinator did not answer within 60 s")
