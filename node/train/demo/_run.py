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
from pathlib import Path
from typing import Any

import tomli_w
from rich.console import Console
from rich.live import Live
from rich.table import Table

from cnode.auth import Identity, save_identity
from cnode.node._children import die_with_parent
from cnode.node._config import IDENTITY_FILE, NodeConfig, save_config
from cnode.node._new_run import new_run_training

from .._report import Event, read_report
from ._report import final_report
from ._swarm import DemoSettings, Role, _Proc

__all__ = ["DemoSettings", "run_demo"]

RUN_ID = "demo"
_READER = Identity.generate()  # reads the coordinator's signed state; needs no membership


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
        # Each node ends with the demo, even one killed with SIGKILL (_children.py).
        return subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent()
        )


# How long a node has to leave its round after SIGTERM before it is killed.
STOP_GRACE_S = 10.0


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process still running, then wait for them together: each gets
    STOP_GRACE_S to leave its round, then SIGKILL. Together, not one after another: six nodes
    leaving on a loaded machine took longer than a person (or a test) waits after Ctrl-C."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_GRACE_S)


def _last(events: list[dict[str, Any]], kind: Event) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e["event"] == kind), None)


_STATUS = {
    Event.STARTED: "starting",
    Event.LISTENING: "joined",
    Event.JOINING: "joining late",
    Event.CAUGHT_UP: "caught up",
    Event.ROUND: "training",
    Event.BAN_REPORTED: "reported a ban",
    Event.RESUMED: "resumed",
}


def _short_reason(reason: str) -> str:
    return reason if len(reason) <= 60 else reason[:57] + "..."


def _status_table(
    procs: list[_Proc],
    settings: DemoSettings,
    coordinator: str,
    bans: dict[str, str],
    started: float,
) -> Table:
    """One row per node; ``bans``: banned peer id -> the ban's kind (the signed state's)."""
    rounds, late_after = settings.rounds, settings.late_after_round
    table = Table(
        title=f"cnode demo · run {RUN_ID!r} · {rounds} rounds · {time.monotonic() - started:.0f} s",
        caption=coordinator,
    )
    for col in ("node", "role", "round", "held-out loss", "state CID", "status"):
        table.add_column(col)
    for p in procs:
        events = read_report(p.report)
        last_round = _last(events, Event.ROUND)
        stopped = _last(events, Event.STOPPED)
        if p.popen is None:
            status = "not started"
        elif p.popen.poll() is None:
            status = _STATUS.get(events[-1]["event"], events[-1]["event"]) if events else "starting"
            if status == "starting" and p.role is Role.LATE_JOINER and events:
                status = f"waiting for round {late_after} before joining"
        elif p.peer in bans:
            status = f"exited {p.popen.returncode}: banned by the coordinator ({bans[p.peer]})"
        else:
            why = _short_reason(stopped["reason"]) if stopped else "no report"
            status = f"exited {p.popen.returncode}: {why}"
        table.add_row(
            p.name,
            p.role,
            str(last_round["round"]) if last_round else "-",
            f"{last_round['loss']:.4f}" if last_round else "-",
            "…" + last_round["state_cid"][-10:] if last_round else "-",
            status,
        )
    return table


def _coordinator_line(url: str, run_config: Path) -> tuple[str, dict[str, str]]:
    """One line about the coordinator's signed state (read, signature checked), and its bans:
    banned peer id -> the ban's kind."""
    from cnode.node.coordinator import (
        CoordinatorError,
        SyncCoordinatorClient,
        load_run_config,
    )

    config = load_run_config(run_config)
    try:
        with SyncCoordinatorClient(
            url, run=config.run, coordinator=config.coordinator, identity=_READER
        ) as client:
            state = client.run_state()
    except CoordinatorError as exc:
        return f"coordinator: {exc}", {}
    line = f"coordinator: round {state.round.round}, phase {state.phase}"
    if state.checkpoint is not None:
        line += f", checkpoint of round {state.checkpoint.round}"
    if state.bans:
        line += f", {len(state.bans)} banned"
    if state.waiting:
        line += f" · {state.waiting}"
    return line, {b.peer: str(b.kind) for b in state.bans}


def run_demo(settings: DemoSettings, console: Console) -> int:
    """Run the swarm, show it live, print the report; 0 when every check held."""
    from cnode.node.coordinator.server import CoordinatorProcess

    with _workdir(settings.workdir) as work:
        procs = _prepare(work, settings)
        key_file, run_config = _coordinator_files(work, procs, settings)
        console.print(f"[bold]cnode demo[/bold]: working in {work}")
        coordinator = CoordinatorProcess(
            run_config,
            work / "coordinator.db",
            key_file,
            log_path=work / "coordinator.log",
            # The coordinator also gossips its signed state: nodes learn of bans at once.
            p2p_listen="/ip4/127.0.0.1/tcp/0",
        )
        with console.status("starting the coordinator"):
            coordinator.start()
        started: list[subprocess.Popen[bytes]] = []
        try:
            url = coordinator.url
            # Up until the report is printed (the coordinator stops in the finally below).
            console.print(f"[bold]dashboard[/bold]: {url}/ (live until the report)")
            console.print(
                f"[bold]metrics[/bold]: {url}/metrics, and each node's at "
                f"http://127.0.0.1:PORT/metrics, PORT = "
                + ", ".join(f"{p.metrics_port} ({p.name})" for p in procs)
            )
            # Every process starts now (imports take a while on a loaded machine); the late
            # joiner stays out of the run until round `late_after_round` is published.
            for p in procs:
                p.popen = _start(_node_cmd(p, run_config, url, procs, settings), p.node_log)
                started.append(p.popen)
            began = time.monotonic()
            deadline = began + settings.timeout_s

            def table() -> Table:
                line, bans = _coordinator_line(url, run_config)
                return _status_table(procs, settings, line, bans, began)

            with Live(table(), console=console, refresh_per_second=2) as live:
                while time.monotonic() < deadline:
                    time.sleep(0.5)
                    live.update(table())
                    honest = [p for p in procs if p.role is not Role.ATTACKER]
                    if all(p.popen is not None and p.popen.poll() is not None for p in honest):
                        break
                live.update(table())
            console.print(f"\nthe swarm ran for {time.monotonic() - began:.0f} s\n")
            return final_report(work, procs, url, run_config, settings, console)
        finally:
            _stop_all(started)
            coordinator.stop()


def _round_of(proc: _Proc) -> int:
    last = _last(read_report(proc.report), Event.ROUND)
    return int(last["round"]) if last else 0


def _prepare(work: Path, settings: DemoSettings) -> list[_Proc]:
    roles = [Role.HONEST] * settings.honest + [Role.ATTACKER, Role.LATE_JOINER]
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
        procs.append(_Proc(name, role, home, identity.peer_id_str, port, _free_port()))
    return procs


def _coordinator_files(work: Path, procs: list[_Proc], settings: DemoSettings) -> tuple[Path, Path]:
    key = Identity.generate()
    key_file = work / "coordinator.key"
    save_identity(key, key_file)
    config = {
        "run": RUN_ID,
        "coordinator": key.peer_id_str,
        "rounds": {
            "min_participants": settings.honest,
            "round_timeout_s": 60.0,
            "checkpoint_every": 1,
            "cooldown_s": 30.0,
            # After each checkpoint, time for every member to join the next round before the
            # first ready member closes its list (DISCO: late comers go to the round after).
            "warmup_s": 1.5,
        },
        "access": {"peers": [p.peer for p in procs]},
        # Every node listens on 127.0.0.1 and advertises that address through the coordinator.
        "network": {"allow_private_addrs": True},
        "training": {**new_run_training(settings.codec), **settings.training},
    }
    run_config = work / "run.toml"
    run_config.write_text(tomli_w.dumps(config), encoding="utf-8")
    return key_file, run_config


def _node_cmd(
    p: _Proc, run_config: Path, url: str, procs: list[_Proc], settings: DemoSettings
) -> list[str]:
    cmd = [
        *_cnode(), "--log-json", "train",
        "--run", RUN_ID,
        "--run-config", str(run_config),
        "--home", str(p.home),
        "--coordinator", url,
        "--listen", f"/ip4/127.0.0.1/tcp/{p.port}",
        "--rounds", str(settings.rounds),
        "--report", str(p.report),
        "--metrics", f"127.0.0.1:{p.metrics_port}",
    ]  # fmt: skip
    if p is procs[0]:
        cmd.append("--checkpointer")
    # No --bootstrap: like any user's node, each learns the others from the coordinator.
    if p.role is Role.ATTACKER:
        cmd += ["--attack", settings.attack]
    if p.role is Role.LATE_JOINER:
        cmd += ["--join-after-round", str(settings.late_after_round)]
    return cmd
