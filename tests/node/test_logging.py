"""Logging and CLI conventions: JSON lines carry the peer id, secrets never appear anywhere,
`--help` lists every command, errors are one line (traceback only with --debug).

The secret tests run the real ``cnode`` console script as a subprocess and read everything it
writes; the rest runs in-process (each cnode process start costs seconds of imports here).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from cnode.auth import load_identity
from cnode.node._logging import bind_context, configure_logging, short_peer
from cnode.node.cli import build_parser, main
from tests.support.fixtures import hf_hub  # noqa: F401
from tests.support.hf_hub import FakeHub

CNODE = [sys.executable, "-m", "cnode"]
TIMEOUT_S = 90  # one cnode process, imports included, on a loaded machine


@pytest.fixture(autouse=True)
def _clear_context() -> Iterator[None]:
    yield
    structlog.contextvars.clear_contextvars()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "CNODE_HOME")}
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CNODE, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def _json_lines(stderr: str) -> list[dict]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


# -- subprocesses: secrets and JSON lines -----------------------------------------------------


def test_hf_login_env_token_never_output_and_json_lines_carry_peer(
    tmp_path: Path,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    token = hf_hub.add_user("alice", orgs=["acme"])
    home = tmp_path / "home"
    env = _env(HF_TOKEN=token, HF_ENDPOINT=hf_hub.url)
    proc = _run(["--log-json", "init", "--hf-login", "--home", str(home)], env)
    assert proc.returncode == 0, proc.stderr
    assert token not in proc.stdout and token not in proc.stderr
    peer = load_identity(home / "identity.key").peer_id_str
    assert f"peer id: {peer}" in proc.stdout
    records = _json_lines(proc.stderr)  # every stderr line is JSON
    assert {r["event"] for r in records} >= {"identity_created", "config_written", "hf_login"}
    for record in records:
        assert record["peer"] == short_peer(peer)
    # The token is on disk only in the 0600 file.
    assert (home / "hf_token").read_text() == token


def test_token_flag_not_token_shaped_never_output_even_with_debug(
    tmp_path: Path,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    # Not hf_-shaped, so the log redaction's pattern cannot be what hides it.
    token = "plain-S3cret-Value-987654321"
    hf_hub.add_user("bob", token=token)
    home = tmp_path / "home"
    env = _env(HF_ENDPOINT=hf_hub.url)
    args = ["--debug", "--log-json", "init", "--hf-login", "--token", token, "--home", str(home)]
    proc = _run(args, env)
    assert proc.returncode == 0, proc.stderr
    assert token not in proc.stdout and token not in proc.stderr
    # A refused token is not echoed either, even with --debug's traceback.
    hf_hub.revoke(token)
    proc = _run(args, env)
    assert proc.returncode == 1
    assert "rejected the token" in proc.stderr
    assert token not in proc.stdout and token not in proc.stderr


def test_error_is_one_line_from_the_console_script(tmp_path: Path) -> None:
    home = tmp_path / "file"
    home.write_text("x")
    proc = _run(["init", "--home", str(home)], _env())
    assert proc.returncode == 1
    assert proc.stderr == f"cnode: error: home {home} exists and is not a folder\n"


def test_prompt_on_a_terminal_does_not_echo(
    tmp_path: Path,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    token = hf_hub.add_user("carol")
    home = tmp_path / "home"
    env = _env(HF_ENDPOINT=hf_hub.url)
    pid, fd = pty.fork()
    if pid == 0:  # child: the pty is its controlling terminal, as for a person typing
        os.execve(sys.executable, [*CNODE, "init", "--hf-login", "--home", str(home)], env)
    seen = b""
    try:
        seen = _read_until(fd, b"(input hidden): ", deadline=time.monotonic() + TIMEOUT_S)
        os.write(fd, token.encode() + b"\n")
        seen += _read_until(fd, None, deadline=time.monotonic() + TIMEOUT_S)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen.decode(errors="replace")
    assert token.encode() not in seen
    assert b"Logged in to Hugging Face as carol" in seen
    assert (home / "hf_token").read_text() == token


def _read_until(fd: int, marker: bytes | None, deadline: float) -> bytes:
    """Read the pty until ``marker`` appears (or EOF when None); bounded by ``deadline``."""
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            if marker is None:
                return data
            break
        data += chunk
        if marker is not None and marker in data:
            return data
    raise AssertionError(f"timed out waiting for {marker!r}; got {data!r}")


# -- in-process: CLI conventions ---------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_help_lists_every_command_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    commands = _subcommands(parser)
    assert "init" in commands
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.dest in out, choice.dest
                assert choice.help, f"{choice.dest} has no help line"
                assert " ".join(choice.help.split()[:3]) in " ".join(out.split())


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    def walk(prefix: list[str], parser: argparse.ArgumentParser) -> Iterator[list[str]]:
        for name, sub in _subcommands(parser).items():
            yield [*prefix, name]
            yield from walk([*prefix, name], sub)

    paths = list(walk([], build_parser()))
    assert ["init"] in paths
    for path in paths:
        with pytest.raises(SystemExit) as info:
            main([*path, "--help"])
        assert info.value.code == 0, path
        assert "usage: cnode " + " ".join(path) in capsys.readouterr().out


def test_error_line_and_debug_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "file"
    home.write_text("x")
    assert main(["init", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert err == f"cnode: error: home {home} exists and is not a folder\n"
    assert main(["--debug", "init", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().endswith(f"cnode: error: home {home} exists and is not a folder")


def test_json_lines_carry_bound_context_and_redact(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    bind_context(peer="12D3KooWLongPeerIdEndingIn12345678", run="run-1", round=3)
    log = structlog.get_logger("test")
    log.info("joined", hf_token="tok-1", note="hf_AbCdEfGh12345678 in text", authorization="x")
    record = json.loads(capsys.readouterr().err)
    assert record["peer"] == "12345678"
    assert (record["run"], record["round"], record["event"]) == ("run-1", 3, "joined")
    assert record["hf_token"] == "[redacted]" and record["authorization"] == "[redacted]"
    assert "hf_AbCdEfGh12345678" not in json.dumps(record)


def test_event_names_are_never_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    log = structlog.get_logger("test")
    token = "hf_" + "Ab1" * 11 + "C"  # the shape of a real Hugging Face token: hf_ + 34
    for event in ("hf_imported", "hf_exported", "hf_verified_import"):
        log.info(event, repo=f"acme/x {token}")
    log.info(f"token {token} in an event")
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    events = [r["event"] for r in records]
    assert events[:3] == ["hf_imported", "hf_exported", "hf_verified_import"]
    assert all(r["repo"] == "acme/x [redacted]" for r in records[:3])  # values still are
    assert events[3] == "token [redacted] in an event"


def test_libp2p_standard_logging_becomes_structured_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging

    tcp = logging.getLogger("libp2p.transport.tcp.tcp")
    gossip = logging.getLogger("libp2p.pubsub.gossipsub")
    configure_logging(json=True)
    tcp.error("Failed to open TCP stream: %s", "connection refused")
    gossip.warning("pending message queue for peer %s exceeded limit (%d > %d)", "Qm", 33, 32)
    gossip.warning("heartbeat took %d ms", 900)
    gossip.info("subscribed to %s", "a-topic")  # the library's info lines stay its own
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines  # the per-peer noise is debug, below the default level
    record = json.loads(lines[0])
    assert (record["event"], record["level"]) == ("library_log", "warning")
    assert (record["library"], record["message"]) == (
        "libp2p.pubsub.gossipsub",
        "heartbeat took 900 ms",
    )
    configure_logging(json=True, level="debug")
    tcp.error("Failed to open TCP stream: %s", "connection refused")
    record = json.loads(capsys.readouterr().err)
    assert (record["level"], record["message"]) == (
        "debug",
        "Failed to open TCP stream: connection refused",
    )
    configure_logging(json=True)


def test_a_library_logger_with_its_own_info_level_stays_quiet_at_info(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """py-libp2p's auto-connector sets INFO on its own logger (issue 23: ``initiating 200 new
    dials`` every 10 s in every node): at info its lines are not ours to print."""
    import logging

    import libp2p.network.auto_connector  # noqa: F401  (its module sets the logger's level)

    chatty = logging.getLogger("libp2p.network.auto_connector")
    assert chatty.level == logging.INFO  # the library's own setting
    configure_logging(json=True)
    chatty.info("Connections (%s) below target (%s); initiating %s new dials", 0, 200, 200)
    chatty.warning("a real warning")
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["a real warning"]
    configure_logging(json=True, level="debug")
    chatty.info("initiating %s new dials", 200)
    assert json.loads(capsys.readouterr().err)["level"] == "info"  # --debug shows it
    configure_logging(json=True)


def test_console_lines_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=False)
    structlog.get_logger("test").info("hello", n=1)
    err = capsys.readouterr().err
    assert "hello" in err and "n=1" in err
    with pytest.raises(json.JSONDecodeError):
        json.load(io.StringIO(err))


# -- in-process: what main() binds and reads -------------------------------------------------


def _node_home(tmp_path: Path) -> tuple[Path, str]:
    from cnode.auth import Identity, save_identity

    home = tmp_path / "home"
    identity = Identity.generate()
    save_identity(identity, home / "identity.key")
    return home, identity.peer_id_str


def test_checkpoint_json_lines_carry_the_node_peer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home, peer = _node_home(tmp_path)
    assert main(["--log-json", "checkpoint", "gc", "--home", str(home)]) == 0
    records = _json_lines(capsys.readouterr().err)
    assert [r["event"] for r in records] == ["gc_done"]
    assert records[0]["peer"] == short_peer(peer)
    # a key main() cannot use (mode 0644) binds nothing and fails nothing: gc still runs
    (home / "identity.key").chmod(0o644)
    assert main(["--log-json", "checkpoint", "gc", "--home", str(home)]) == 0
    assert "peer" not in _json_lines(capsys.readouterr().err)[0]


def test_coordinator_binds_its_own_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key, out = tmp_path / "coord.key", tmp_path / "run.toml"
    assert main(["coordinator", "new-run", "r1", "--key", str(key), "--out", str(out)]) == 0
    peer = load_identity(key).peer_id_str
    assert structlog.contextvars.get_contextvars() == {"peer": short_peer(peer), "run": "r1"}
    capsys.readouterr()


def test_log_format_json_from_config_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cnode.node._config import NodeConfig, save_config

    home, _ = _node_home(tmp_path)
    assert main(["checkpoint", "gc", "--home", str(home)]) == 0  # no config.toml: console
    with pytest.raises(json.JSONDecodeError):
        _json_lines(capsys.readouterr().err)
    save_config(home, NodeConfig(log_format="json"))
    assert main(["checkpoint", "gc", "--home", str(home)]) == 0
    assert [r["event"] for r in _json_lines(capsys.readouterr().err)] == ["gc_done"]
    # a bad config.toml does not break main(); the command that reads it reports it, one line
    (home / "config.toml").write_text('log_format = "xml"\n')
    assert main(["checkpoint", "gc", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cnode: error: ") and "log_format" in err and err.count("\n") == 1


def test_stray_os_error_is_one_line_traceback_only_with_debug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "run.toml"
    argv = ["coordinator", "new-run", "r1", "--key", str(tmp_path / "k"), "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err  # the key is made first, which logs one line
    assert err.endswith(f"\ncnode: error: No such file or directory: {out}\n")
    assert "Traceback" not in err and "Errno" not in err
    assert main(["--debug", *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "FileNotFoundError" in err
    assert err.endswith(f"cnode: error: No such file or directory: {out}\n")
