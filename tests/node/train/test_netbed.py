"""Runs across hosts: every process in its own network namespace (../shared/tools/netbed.sh).

Each host has its own address (10.77.0.10 + i) on a bridge with a capped upload, and nothing
but the testbed's subnet is routed. Every node is told only the coordinator's URL and listens
on the default address (/ip4/0.0.0.0/tcp/4001): what it advertises comes from its interfaces.

- Four hosts train to agreement, and a late joiner fetches the checkpoint from every holder.
- One node is cut off from its peers mid-run (blackhole routes both ways; the coordinator stays
  reachable): it does not diverge silently. It gives the round up, tries to catch up, and stops
  with an error naming the members it could not reach; the others go on to agreement.

Needs root and iproute2; without them the tests are skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from cnode.auth import Identity, save_identity
from cnode.node._config import IDENTITY_FILE
from cnode.node.train import StopReason
from cnode.node.train._report import read_report
from tests.support.forked import CnodeProcess, ForkedCoordinatorProcess, start_cnode

from .swarm import SPLIT_WORTHY_MODEL, TINY_TRAINING

pytestmark = pytest.mark.slow

NETBED = Path(__file__).resolve().parents[4] / "shared" / "tools" / "netbed.sh"
RUN = "net"
COORDINATOR_PORT = 8470


def _host(i: int) -> str:
    return f"10.77.0.{10 + i}"


class Netbed:
    """The netbed hosts, the coordinator on host 0, and ``cnode train`` processes."""

    def __init__(
        self,
        tmp: Path,
        hosts: int,
        *,
        min_participants: int,
        training: dict[str, Any] | None = None,
    ) -> None:
        self.tmp = tmp
        self.hosts = hosts
        self.procs: dict[str, CnodeProcess] = {}
        self.homes: dict[str, Path] = {}
        self.peers: dict[str, str] = {}
        self.coordinator: ForkedCoordinatorProcess | None = None
        self.min_participants = min_participants
        self.training = dict(training or {})  # settings over TINY_TRAINING

    def up(self, names: list[str]) -> None:
        subprocess.run(["bash", str(NETBED), "down"], capture_output=True, timeout=60)
        subprocess.run(
            ["bash", str(NETBED), "up", str(self.hosts), "200"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        for name in names:
            home = self.tmp / name
            home.mkdir()
            identity = Identity.generate()
            save_identity(identity, home / IDENTITY_FILE)
            self.homes[name], self.peers[name] = home, identity.peer_id_str
        key = Identity.generate()
        save_identity(key, self.tmp / "coordinator.key")
        config: dict[str, Any] = {
            "run": RUN,
            "coordinator": key.peer_id_str,
            "url": f"http://{_host(0)}:{COORDINATOR_PORT}",
            "rounds": {
                "min_participants": self.min_participants,
                "round_timeout_s": 20.0,
                "checkpoint_every": 1,
                "cooldown_s": 20.0,
                "warmup_s": 1.0,
                "collect_timeout_s": 20.0,
            },
            "access": {"peers": list(self.peers.values())},
            # The testbed's 10.77.0.0/24 is a private range, as a LAN's would be.
            "network": {"allow_private_addrs": True},
            "training": {**TINY_TRAINING, **self.training},
        }
        (self.tmp / "run.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
        self.coordinator = ForkedCoordinatorProcess(
            self.tmp / "run.toml",
            self.tmp / "coordinator.db",
            self.tmp / "coordinator.key",
            listen=f"{_host(0)}:{COORDINATOR_PORT}",
            p2p_listen=f"/ip4/{_host(0)}/tcp/0",
            wrap=("ip", "netns", "exec", "cb0"),
        ).start()

    def start(self, name: str, host: int, *extra: str, rounds: int) -> None:
        argv = [
            "--log-json", "train",
            "--run", RUN, "--run-config", str(self.tmp / "run.toml"),
            "--home", str(self.homes[name]),
            "--rounds", str(rounds),
            "--report", str(self.homes[name] / "report.jsonl"),
            *extra,
        ]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1")
        log = self.homes[name] / "node.log"
        self.procs[name] = start_cnode(argv, env, log, netns=f"cb{host}")

    def blackhole(self, host: int, other: int) -> None:
        """Host ``host`` can no longer reach host ``other`` (packets are dropped)."""
        subprocess.run(
            ["ip", "-n", f"cb{host}", "route", "add", "blackhole", f"{_host(other)}/32"],
            check=True,
            timeout=10,
        )

    def events(self, name: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in read_report(self.homes[name] / "report.jsonl") if e["event"] == kind]

    def wait_exit(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not exit\n{self.describe()}") from None

    def describe(self) -> str:
        out = []
        for name, home in self.homes.items():
            log = home / "node.log"
            tail = log.read_bytes()[-1500:].decode("utf-8", "replace") if log.exists() else ""
            out.append(f"--- {name}\n{tail}")
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
        subprocess.run(["bash", str(NETBED), "down"], capture_output=True, timeout=60)


@pytest.fixture
def testbed_factory(tmp_path: Path) -> Iterator[list[Netbed]]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("network namespaces need root and iproute2 (ip, tc)")
    if not NETBED.exists():
        pytest.skip(f"{NETBED} is missing (../shared beside the checkout)")
    made: list[Netbed] = []
    try:
        yield made
    finally:
        for bed in made:
            bed.close()


def test_four_hosts_agree_and_a_late_joiner_fetches_from_every_holder(
    tmp_path: Path, testbed_factory: list[Netbed]
) -> None:
    rounds = 5
    # The late joiner's catch-up is spread over every holder only when it is worth splitting.
    bed = Netbed(tmp_path, 5, min_participants=3, training={"model": SPLIT_WORTHY_MODEL})
    testbed_factory.append(bed)
    bed.up(["a", "b", "c", "late"])
    bed.start("a", 1, "--checkpointer", rounds=rounds)
    bed.start("b", 2, rounds=rounds)
    bed.start("c", 3, rounds=rounds)
    bed.start("late", 4, "--join-after-round", "2", rounds=rounds)
    for name in ("a", "b", "c", "late"):
        assert bed.wait_exit(name, timeout=300) == 0, bed.describe()

    finals = {n: bed.events(n, "round")[-1] for n in ("a", "b", "c", "late")}
    assert {e["round"] for e in finals.values()} == {rounds}
    assert len({e["state_cid"] for e in finals.values()}) == 1, finals
    for name, host in (("a", 1), ("b", 2), ("c", 3)):
        (listening,) = bed.events(name, "listening")
        assert listening["advertised"] == [f"/ip4/{_host(host)}/tcp/4001/p2p/{bed.peers[name]}"]
    (caught,) = bed.events("late", "caught_up")
    assert caught["source"] == "peers"
    holders = {bed.peers[n] for n in ("a", "b", "c")}
    served = {h for h, n in caught["bytes_per_holder"].items() if n > 0}
    assert served == holders, caught


def test_a_node_cut_off_from_its_peers_stops_with_a_clear_error(
    tmp_path: Path, testbed_factory: list[Netbed]
) -> None:
    rounds = 12  # the others go on long enough for the cut-off node to try to catch up
    # Full replication: the message names the members whose agreed updates it could not fetch.
    bed = Netbed(tmp_path, 4, min_participants=2, training={"partitioned": "never"})
    testbed_factory.append(bed)
    bed.up(["a", "b", "c"])
    bed.start("a", 1, "--checkpointer", rounds=rounds)
    bed.start("b", 2, rounds=rounds)
    bed.start("c", 3, rounds=rounds)
    deadline_rounds = 2

    def round_everywhere() -> bool:
        return all(len(bed.events(n, "round")) >= deadline_rounds for n in ("a", "b", "c"))

    import time

    give_up = time.monotonic() + 180
    while not round_everywhere():
        assert time.monotonic() < give_up, bed.describe()
        time.sleep(0.3)
    # c loses its peers (both ways); the coordinator on host 0 stays reachable for everyone.
    for peer_host in (1, 2):
        bed.blackhole(3, peer_host)
        bed.blackhole(peer_host, 3)

    assert bed.wait_exit("c", timeout=300) == StopReason.UNREACHABLE.exit_code, bed.describe()
    assert bed.events("c", "stopped")[0]["stop_reason"] == "unreachable"
    (stopped,) = bed.events("c", "stopped")
    # It names the members it could not reach, and why it could not recover.
    assert bed.peers["a"] in stopped["reason"] and bed.peers["b"] in stopped["reason"], stopped
    assert "could not fetch the agreed updates" in stopped["reason"], stopped
    assert bed.events("c", "round_given_up")
    # c never aggregated a set of its own: every round it finished agrees with a's.
    a_states = {e["round"]: e["state_cid"] for e in bed.events("a", "round")}
    for event in bed.events("c", "round"):
        assert a_states[event["round"]] == event["state_cid"]

    # The others go on to agreement without it.
    for name in ("a", "b"):
        assert bed.wait_exit(name, timeout=300) == 0, bed.describe()
    finals = {n: bed.events(n, "round")[-1] for n in ("a", "b")}
    assert {e["round"] for e in finals.values()} == {rounds}
    assert len({e["state_cid"] for e in finals.values()}) == 1, finals
