"""A real swarm for tests: a coordinator process and ``cnode train`` processes on 127.0.0.1.

Every process is stopped by :meth:`Swarm.close` (SIGTERM, then SIGKILL), which the fixture calls
in ``finally``. Waits are bounded and fail with the tails of the logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from cnode.auth import Identity, load_identity, make_hf_binding, save_identity
from cnode.node._config import (
    HF_BINDING_FILE,
    HF_TOKEN_FILE,
    IDENTITY_FILE,
    NodeConfig,
    save_config,
)
from cnode.node.coordinator import SyncCoordinatorClient, load_run_config
from cnode.node.train._report import read_report
from tests.support.forked import CnodeProcess, ForkedCoordinatorProcess, start_cnode

RUN = "t"
# Small enough that a round takes about a second on two loaded cores.
TINY_TRAINING: dict[str, Any] = {
    "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32},
    "data": {"seq_len": 32, "eval_sequences": 16},
    "local_steps": 3,
    "batch_size": 4,
}

# A checkpoint worth spreading over holders, for the tests of a catch-up from several: a fetch
# under MIN_SPLIT_BYTES (256 KiB) is one request to one holder (specs/blocks.md#fetching, 12),
# and TINY_TRAINING's checkpoint is ~186 KB; this model's is ~2.5 MB.
SPLIT_WORTHY_MODEL: dict[str, Any] = {"n_layer": 1, "n_embd": 192, "n_head": 2, "n_positions": 32}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    name: str
    home: Path
    peer: str
    port: int
    procs: list[CnodeProcess] = field(default_factory=list)

    @property
    def report(self) -> Path:
        return self.home / "report.jsonl"

    @property
    def log(self) -> Path:
        return self.home / "node.log"

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        events = read_report(self.report)
        return [e for e in events if kind is None or e["event"] == kind]

    def last_round(self) -> int:
        rounds = self.events("round")
        return int(rounds[-1]["round"]) if rounds else 0

    @property
    def proc(self) -> CnodeProcess:
        return self.procs[-1]


class Swarm:
    def __init__(
        self,
        tmp: Path,
        names: list[str],
        *,
        min_participants: int,
        round_timeout_s: float = 20.0,
        hf_endpoint: str | None = None,
        checkpoint_every: int = 1,
        coordinator_port: int = 0,  # fixed, so it can restart on the same URL
        collect_timeout_s: float = 30.0,
        gateways: list[str] | None = None,
        training: dict[str, Any] | None = None,  # settings over TINY_TRAINING
        backup_step_s: float | None = None,
        late_max_s: float | None = None,  # rounds.late_max_s (None: the run default)
        allow_private_addrs: bool = True,  # False: a public run, as a user who left it out
        # Identities from the names (the same peer ids, so the same data shards, every run): for
        # tests whose outcome depends on which shard each peer trains and is scored on.
        fixed_identities: bool = False,
    ) -> None:
        self.tmp = tmp
        self.gateways = list(gateways or [])  # the run config's trustless gateways
        self.hf_endpoint = hf_endpoint  # the (fake) Hub of the coordinator and of every node
        self.nodes: dict[str, Node] = {}
        for name in names:
            home = tmp / name
            home.mkdir(parents=True)
            identity = (
                Identity.from_seed(hashlib.sha256(f"swarm/{name}".encode()).digest())
                if fixed_identities
                else Identity.generate()
            )
            save_identity(identity, home / IDENTITY_FILE)
            port = _free_port()
            save_config(home, NodeConfig(listen=f"/ip4/127.0.0.1/tcp/{port}"))
            self.nodes[name] = Node(name, home, identity.peer_id_str, port)
        key = Identity.generate()
        save_identity(key, tmp / "coordinator.key")
        config = {
            "run": RUN,
            "coordinator": key.peer_id_str,
            "rounds": {
                "min_participants": min_participants,
                "round_timeout_s": round_timeout_s,
                "checkpoint_every": checkpoint_every,
                "cooldown_s": 20.0,
                # Time for every member to join the next round before its list can close.
                "warmup_s": 1.0,
                "collect_timeout_s": collect_timeout_s,
            },
            "access": {"peers": [n.peer for n in self.nodes.values()]},
            # Everyone is on 127.0.0.1: without this no node has an address others may dial.
            "network": {"allow_private_addrs": allow_private_addrs},
            "training": {**TINY_TRAINING, **(training or {})},
        }
        if backup_step_s is not None:
            config["rounds"]["backup_step_s"] = backup_step_s  # type: ignore[index]
        if late_max_s is not None:
            config["rounds"]["late_max_s"] = late_max_s  # type: ignore[index]
        if self.gateways:
            config["gateways"] = self.gateways
        self.run_config = tmp / "run.toml"
        self.run_config.write_text(tomli_w.dumps(config), encoding="utf-8")
        self.coordinator = ForkedCoordinatorProcess(
            self.run_config,
            tmp / "coordinator.db",
            tmp / "coordinator.key",
            hf_endpoint=hf_endpoint,
            p2p_listen="/ip4/127.0.0.1/tcp/0",  # it gossips its signed state; nodes follow it
            listen=f"127.0.0.1:{coordinator_port}",
        )
        self.coordinator.start()

    def start(self, name: str, *extra: str, rounds: int, checkpointer: bool = False) -> Node:
        node = self.nodes[name]
        argv = [
            "--log-json", "train",
            "--run", RUN,
            "--run-config", str(self.run_config),
            "--home", str(node.home),
            "--coordinator", self.coordinator.url,
            "--rounds", str(rounds),
            "--report", str(node.report),
            *extra,
        ]  # fmt: skip
        if checkpointer:
            argv.append("--checkpointer")
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        if self.hf_endpoint is not None:
            env["HF_ENDPOINT"] = self.hf_endpoint
        # A fork of a process that imported cnode already (forked.py), unless env says otherwise.
        node.procs.append(start_cnode(argv, env, node.log))
        return node

    def hf_login(self, name: str, username: str, token: str) -> None:
        """What `cnode init --hf-login` leaves in a home: the token (0600) and the binding."""
        node = self.nodes[name]
        identity = load_identity(node.home / IDENTITY_FILE)
        (node.home / HF_TOKEN_FILE).write_text(token)
        os.chmod(node.home / HF_TOKEN_FILE, 0o600)
        binding = make_hf_binding(identity, username, int(time.time()))
        (node.home / HF_BINDING_FILE).write_bytes(binding)

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}\n{self.describe()}")

    def wait_exit(self, node: Node, timeout: float) -> int:
        try:
            return node.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{node.name} did not exit\n{self.describe()}") from None

    def describe(self) -> str:
        out = []
        for node in self.nodes.values():
            tail = (
                node.log.read_bytes()[-1500:].decode("utf-8", "replace")
                if node.log.exists()
                else ""
            )
            out.append(
                f"--- {node.name}: events {[e['event'] for e in node.events()][-8:]}\n{tail}"
            )
        out.append(f"--- coordinator\n{self.coordinator.log_tail(1500)}")
        return "\n".join(out)

    def run_state(self) -> Any:
        config = load_run_config(self.run_config)
        with SyncCoordinatorClient(
            self.coordinator.url,
            run=RUN,
            coordinator=config.coordinator,
            identity=Identity.generate(),
        ) as client:
            return client.run_state()

    def round_info(self, n: int) -> Any:
        """Round ``n``'s signed record, as a node reads it."""
        import trio

        from cnode.node.coordinator import CoordinatorClient

        config = load_run_config(self.run_config)

        async def get() -> Any:
            async with CoordinatorClient(
                self.coordinator.url,
                run=RUN,
                coordinator=config.coordinator,
                identity=Identity.generate(),
            ) as client:
                return await client.round_info(n)

        return trio.run(get)

    def signal(self, node: Node, sig: signal.Signals) -> None:
        if node.proc.poll() is None:
            node.proc.send_signal(sig)

    def close(self) -> None:
        for node in self.nodes.values():
            for proc in node.procs:
                if proc.poll() is None:
                    proc.terminate()
        for node in self.nodes.values():
            for proc in node.procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.coordinator.stop()


def final_states(nodes: list[Node]) -> dict[str, tuple[int, str]]:
    out = {}
    for node in nodes:
        rounds = node.events("round")
        if rounds:
            out[node.name] = (rounds[-1]["round"], rounds[-1]["state_cid"])
    return out


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]
