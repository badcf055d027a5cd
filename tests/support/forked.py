"""Start ``cnode`` command lines as forks of a process that has imported cnode (tests only).

A training node's interpreter spends ~7 CPU-s importing torch, transformers and libp2p before it
does anything, and a swarm test starts 3 to 12 of them: on the 2-core machine the suite runs on,
that was a third of its CPU, and most of each swarm test's first 20 s. multiprocessing's
forkserver imports those once per pytest worker; each node is then a fork of that clean,
single-threaded server, and runs the same ``cnode.node.cli.main(argv)`` that ``python -m cnode``
runs, as its own process with its own pid, log file, environment and exit status.

What a fork does not share with ``python -m cnode``: settings that a preloaded library reads when
it is imported, not when it is used. huggingface_hub reads ``HF_ENDPOINT`` and ``HF_HOME`` at
import, so :func:`start_cnode` falls back to a real ``subprocess`` whenever the environment asked
for differs from the server's in one of :data:`READ_AT_IMPORT`. The README's own flow
(``test_user_flow``), the demo's and the console-script tests still exec ``python -m cnode``.

multiprocessing hands the server each fork's target and arguments (argv, environment, paths)
pickled, over its own local socket: test data between a pytest worker and its own child, never
bytes from a network; cnode itself uses no pickle.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from cnode.node.coordinator.server import CoordinatorProcess

__all__ = ["CnodeProcess", "ForkedCnode", "ForkedCoordinatorProcess", "start_cnode"]

# Imported once in the server: everything ``cnode train`` imports before its first round.
PRELOAD = ["cnode.node.cli", "cnode.node.train", "cnode.node.train.model._model"]
# Environment variables a preloaded module reads when it is imported: the server's values hold in
# every fork. OMP_NUM_THREADS is read by libgomp when torch loads it.
READ_AT_IMPORT = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "OMP_NUM_THREADS")
# What the swarms run nodes with (swarm.py): one OpenMP thread each, on a 2-core machine.
SERVER_ENV = {"OMP_NUM_THREADS": "1"}


class CnodeProcess(Protocol):
    """What tests use of a node's process: ``subprocess.Popen``'s own names."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


CLONE_NEWNET = 0x40000000  # setns(2): join a network namespace


def _enter_netns(name: str) -> None:
    """What ``ip netns exec NAME`` does that matters to a node: its sockets live in NAME."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name} failed")
    finally:
        os.close(fd)


def _redirect(path: str, *targets: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for target in targets:
        os.dup2(fd, target)
    os.close(fd)


def _run(
    argv: list[str], env: dict[str, str], log: str, netns: str | None, stdout: str | None
) -> None:
    """In the fork: its network namespace, the log as stderr (and stdout, unless ``stdout``
    names a file of its own), the caller's environment, then the CLI."""
    if netns is not None:
        _enter_netns(netns)
    if stdout:
        _redirect(stdout, 1)
        _redirect(log, 2)
    else:
        _redirect(log, 1, 2)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["cnode", *argv]
    from cnode.node.cli import main

    sys.exit(main(argv))


class ForkedCnode:
    """A ``cnode`` command running in a fork of the preloaded server."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        netns: str | None = None,
        stdout: Path | None = None,
    ) -> None:
        self.args = list(argv)
        self._lock = threading.Lock()
        out = None if stdout is None else str(stdout)
        self._proc = _context().Process(
            target=_run, args=(self.args, dict(env), str(log), netns, out)
        )
        self._proc.start()
        assert self._proc.pid is not None
        self.pid: int = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        # multiprocessing reads the exit status off one pipe: two threads polling at once (a
        # test's wait and procs.py's stdout reader) could each see half of it.
        with self._lock:
            return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        give_up = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if give_up is not None and time.monotonic() >= give_up:
                raise subprocess.TimeoutExpired(["cnode", *self.args], timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_CONTEXT: multiprocessing.context.ForkServerContext | None = None


def _context() -> multiprocessing.context.ForkServerContext:
    """The forkserver, started once per pytest worker with SERVER_ENV and PRELOAD."""
    global _CONTEXT
    if _CONTEXT is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        saved = {k: os.environ.get(k) for k in SERVER_ENV}
        os.environ.update(SERVER_ENV)  # the server's environment is the worker's at its start
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        _CONTEXT = context
    return _CONTEXT


def _server_env() -> dict[str, str]:
    return {**os.environ, **SERVER_ENV}


def start_cnode(
    argv: Sequence[str],
    env: Mapping[str, str],
    log: Path,
    *,
    netns: str | None = None,
    stdout: Path | None = None,
) -> CnodeProcess:
    """``python -m cnode *argv`` with ``env``, stderr (and stdout, unless ``stdout`` is given)
    appended to ``log``, in network namespace ``netns`` if given: a fork of the preloaded
    server, or a real subprocess (under ``ip netns exec``) where ``env`` changes what the server
    read at import."""
    server = _server_env()
    if any(env.get(k) != server.get(k) for k in READ_AT_IMPORT):
        wrap = ["ip", "netns", "exec", netns] if netns else []
        with log.open("ab") as err, (stdout or log).open("ab") as out:
            return subprocess.Popen(
                [*wrap, sys.executable, "-m", "cnode", *argv],
                stdout=out,
                stderr=err,
                env=dict(env),
            )
    return ForkedCnode(argv, env, log, netns, stdout)


class ForkedCoordinatorProcess(CoordinatorProcess):
    """:class:`CoordinatorProcess`, started with :func:`start_cnode` (a fork where it can be)."""

    def _spawn(self, argv: list[str]) -> CnodeProcess:
        netns = None
        if self.wrap:
            if len(self.wrap) != 4 or self.wrap[:3] != ("ip", "netns", "exec"):
                return super()._spawn(argv)  # a wrapper a fork cannot stand for
            netns = self.wrap[3]
        # OMP_NUM_THREADS as the server's: the coordinator runs no torch kernels.
        return start_cnode(argv, _server_env(), self.log_path, netns=netns)
