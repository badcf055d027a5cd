"""A run in the NAT testbed (:mod:`tests.support.nattestbed`): the coordinator on public host 0,
``cnode train`` processes on public hosts or behind their own NAT, each told only the
coordinator's URL and listening on the default address (what it advertises comes from its
interfaces: a NATed node advertises its private LAN address, which nobody outside can dial).

Used by tests/node/train/test_nat_swarm.py and bench/nat.py.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import tomli_w

from cnode.auth import Identity, save_identity
from cnode.node._config import IDENTITY_FILE
from cnode.node.train._report import read_report
from tests.support.forked import CnodeProcess, ForkedCoordinatorProcess, start_cnode

from .nattestbed import NatTestbed

__all__ = ["NatSwarm", "overheads"]

COORDINATOR_PORT = 8470


class NatSwarm:
    """Nodes by name, each on a public host (``public=True``) or behind its own NAT.

    Public host 0 runs the coordinator; nodes take public hosts 1.. and private hosts 0.. in the
    order they are added."""

    def __init__(
        self,
        tmp: Path,
        bed: NatTestbed,
        *,
        rounds: dict[str, Any],
        training: dict[str, Any],
        network: dict[str, Any] | None = None,
    ) -> None:
        self.tmp = tmp
        self.bed = bed
        self.rounds = rounds
        self.training = training
        self.network = {"allow_private_addrs": True, **(network or {})}
        self.procs: dict[str, CnodeProcess] = {}
        self.homes: dict[str, Path] = {}
        self.peers: dict[str, str] = {}
        self.where: dict[str, str] = {}  # name -> namespace
        self.natted: set[str] = set()
        self._next_public, self._next_private = 1, 0
        self.coordinator: ForkedCoordinatorProcess | None = None

    def add(self, name: str, *, public: bool) -> None:
        home = self.tmp / name
        home.mkdir()
        identity = Identity.generate()
        save_identity(identity, home / IDENTITY_FILE)
        self.homes[name], self.peers[name] = home, identity.peer_id_str
        if public:
            self.where[name] = self.bed.public_ns(self._next_public)
            self._next_public += 1
        else:
            self.where[name] = self.bed.private_ns(self._next_private)
            self._next_private += 1
            self.natted.add(name)

    def start_coordinator(self) -> None:
        key = Identity.generate()
        save_identity(key, self.tmp / "coordinator.key")
        host = self.bed.public_ip(0)
        config: dict[str, Any] = {
            "run": "nat",
            "coordinator": key.peer_id_str,
            "url": f"http://{host}:{COORDINATOR_PORT}",
            "rounds": self.rounds,
            "access": {"peers": list(self.peers.values())},
            # The testbed's public side is 10.78.0.0/24, a private range: as on a LAN.
            "network": self.network,
            "training": self.training,
        }
        (self.tmp / "run.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
        self.coordinator = ForkedCoordinatorProcess(
            self.tmp / "run.toml",
            self.tmp / "coordinator.db",
            self.tmp / "coordinator.key",
            listen=f"{host}:{COORDINATOR_PORT}",
            p2p_listen=f"/ip4/{host}/tcp/0",
            wrap=tuple(self.bed.wrap(self.bed.public_ns(0))),
        ).start()

    def start(self, name: str, *extra: str, rounds: int) -> None:
        argv = [
            "--log-json", "train",
            "--run", "nat", "--run-config", str(self.tmp / "run.toml"),
            "--home", str(self.homes[name]),
            "--rounds", str(rounds),
            "--report", str(self.homes[name] / "report.jsonl"),
            *extra,
        ]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1")
        log = self.homes[name] / "node.log"
        self.procs[name] = start_cnode(argv, env, log, netns=self.where[name])

    # -- reading -----------------------------------------------------------------------------

    def events(self, name: str, kind: str | None = None) -> list[dict[str, Any]]:
        report = read_report(self.homes[name] / "report.jsonl")
        return [e for e in report if kind is None or e["event"] == kind]

    def log_lines(self, name: str, needle: str) -> list[str]:
        log = self.homes[name] / "node.log"
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        return [line for line in text.splitlines() if needle in line]

    def wait_exit(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not exit\n{self.describe()}") from None

    def wait_rounds(self, names: list[str], rounds: int, timeout: float) -> None:
        give_up = time.monotonic() + timeout
        while not all(len(self.events(n, "round")) >= rounds for n in names):
            if time.monotonic() > give_up:
                raise AssertionError(f"not {rounds} rounds in {timeout} s\n{self.describe()}")
            time.sleep(0.3)

    def describe(self) -> str:
        out = []
        for name, home in self.homes.items():
            log = home / "node.log"
            tail = log.read_bytes()[-1500:].decode("utf-8", "replace") if log.exists() else ""
            out.append(f"--- {name} ({self.where[name]})\n{tail}")
        if self.coordinator is not None:
            out.append(f"--- coordinator\n{self.coordinator.log_tail(1500)}")
        return "\n".join(out)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self.coordinator is not None:
            self.coordinator.stop()


def overheads(swarm: NatSwarm, names: list[str]) -> list[float]:
    """Per node and round: assembled_at minus the round's latest published_at (seconds)."""
    rows = [e for n in names for e in swarm.events(n, "round")]
    last: dict[int, float] = {}
    for e in rows:
        last[e["round"]] = max(last.get(e["round"], 0.0), float(e["published_at"]))
    return [float(e["assembled_at"]) - last[e["round"]] for e in rows]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
