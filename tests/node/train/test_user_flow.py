"""The README's "Using it" flow, as a user types it on one machine: no address wiring by hand.

`cnode init --hf-login` for three people, `coordinator new-run` and `serve`, `allowlist add` for
each username, then three `cnode train` nodes (one `--checkpointer`), each with its own `--home`
and `--listen`, and no `--bootstrap`: they learn each other from the coordinator. They reach
round 5 on one agreed state CID. The Hub is the local FakeHub (the real one is unreachable).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cnode.node.coordinator.server import CoordinatorProcess
from cnode.node.train._report import read_report
from tests.support.fixtures import hf_hub  # noqa: F401  (pytest finds it by name)
from tests.support.hf_hub import FakeHub

pytestmark = pytest.mark.slow

ROUNDS = 3  # enough for every member in every round; more rounds test nothing new here


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cnode(*args: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cnode", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"cnode {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout


def test_three_nodes_from_the_readme_train_together_without_bootstrap(
    tmp_path: Path,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    env = dict(os.environ, HF_ENDPOINT=hf_hub.url, OMP_NUM_THREADS="1")
    env.pop("HF_TOKEN", None)
    people = ["alice", "bob", "carol"]
    for name in people:
        token = hf_hub.add_user(name)
        _cnode(
            "init", "--home", f"home-{name}", "--hf-login", "--token", token, env=env, cwd=tmp_path
        )
    port = _port()
    url = f"http://127.0.0.1:{port}"
    _cnode(
        "coordinator", "new-run", "fr", "--key", "coord.key", "--out", "run.toml",
        "--url", url, "--min-participants", "3", "--checkpoint-every", "1",
        "--allow-private-addrs",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    coordinator = CoordinatorProcess(
        tmp_path / "run.toml",
        tmp_path / "run.db",
        tmp_path / "coord.key",
        listen=f"127.0.0.1:{port}",
        hf_endpoint=hf_hub.url,
    )
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        coordinator.start()
        for name in people:
            _cnode(
                "allowlist", "add", name, "--run-config", "run.toml", "--key", "coord.key",
                env=env, cwd=tmp_path,
            )  # fmt: skip
        for i, name in enumerate(people):
            cmd = [
                sys.executable, "-m", "cnode", "--log-json", "train",
                "--run", "fr", "--run-config", "run.toml",
                "--home", f"home-{name}",
                "--listen", f"/ip4/127.0.0.1/tcp/{_port()}",
                "--rounds", str(ROUNDS),
                "--report", f"home-{name}/report.jsonl",
            ]  # fmt: skip
            if i == 0:
                cmd.append("--checkpointer")
            with (tmp_path / f"{name}.log").open("wb") as log:
                nodes.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=log))
        for name, proc in zip(people, nodes, strict=True):
            try:
                code = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                code = None
            tail = (tmp_path / f"{name}.log").read_text()[-3000:]
            assert code == 0, f"{name} exited {code}:\n{tail}\n{coordinator.log_tail(2000)}"
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        coordinator.stop()

    finals = {}
    for name in people:
        events = read_report(tmp_path / f"home-{name}" / "report.jsonl")
        rounds = [e for e in events if e["event"] == "round"]
        assert [e["round"] for e in rounds] == list(range(1, ROUNDS + 1)), name
        # Every round had all three members: nobody aggregated alone. Scores are on by default,
        # so an honest update that does not measurably help its own data may sit a round out
        # (specs/aggregation.md, "Scores and reputation"); nothing else may drop one.
        for e in rounds:
            assert len(e["members"]) + len(e["dropped"]) == 3 and len(e["members"]) >= 2, e
            assert all(why.startswith("left out by scores") for why in e["dropped"].values()), e
        finals[name] = rounds[-1]["state_cid"]
        # Each node advertised its --listen address through its join.
        (listening,) = [e for e in events if e["event"] == "listening"]
        assert listening["advertised"] and all(
            a.startswith("/ip4/127.0.0.1/tcp/") for a in listening["advertised"]
        )
    assert len(set(finals.values())) == 1, finals
