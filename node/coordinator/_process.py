"""Run a coordinator as its own OS process (what tests, the demo and benchmarks use).

``python -m cnode coordinator serve ... --ready-file F`` writes ``{"url", "peer_id", "run",
"pid"}`` to F once it listens; :class:`CoordinatorProcess` waits for that file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Protocol

from cnode.node._children import die_with_parent

from ._exceptions import CoordinatorUnavailable

__all__ = ["ChildProcess", "CoordinatorProcess"]

# Seconds a spawned coordinator may take to listen (imports on a loaded 2-core machine are slow).
SPAWN_READY_S = 60.0
# Seconds between SIGTERM and SIGKILL in stop().
STOP_GRACE_S = 10.0


class ChildProcess(Protocol):
    """What :class:`CoordinatorProcess` uses of its process: ``subprocess.Popen``'s names."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class CoordinatorProcess:
    """``with CoordinatorProcess(run_config, db, key) as proc: proc.url, proc.peer_id``.

    Resource handling: leaving the block stops the process (SIGTERM, then SIGKILL); ``kill()``
    sends SIGKILL at once (crash tests); ``start()`` may be called again after either.
    Error handling: a process that exits or stays silent past SPAWN_READY_S raises
    :class:`CoordinatorUnavailable` with the tail of its log.
    """

    def __init__(
        self,
        run_config: Path,
        db: Path,
        key: Path,
        *,
        listen: str = "127.0.0.1:0",
        hf_endpoint: str | None = None,
        log_path: Path | None = None,
        p2p_listen: str | None = None,
        wrap: Sequence[str] = (),
    ) -> None:
        self.run_config, self.db, self.key = Path(run_config), Path(db), Path(key)
        self.listen = listen
        self.hf_endpoint = hf_endpoint
        self.p2p_listen = p2p_listen
        # A command the process runs under, e.g. ("ip", "netns", "exec", "cb0") in tests
        # (it must exec the process, so the pid is the coordinator's own).
        self.wrap = tuple(wrap)
        self.p2p_addrs: list[str] = []
        self.log_path = Path(log_path) if log_path else self.db.with_suffix(".log")
        self.ready_file = self.db.with_suffix(".ready.json")
        self.proc: ChildProcess | None = None
        self.url = ""
        self.peer_id = ""
        self._log: IO[bytes] | None = None

    def start(self) -> CoordinatorProcess:
        self.ready_file.unlink(missing_ok=True)
        argv = [
            "--log-json",
            "coordinator",
            "serve",
            "--run-config",
            str(self.run_config),
            "--db",
            str(self.db),
            "--key",
            str(self.key),
            "--listen",
            self.listen,
            "--ready-file",
            str(self.ready_file),
        ]
        if self.hf_endpoint:
            argv += ["--hf-endpoint", self.hf_endpoint]
        if self.p2p_listen:
            argv += ["--p2p-listen", self.p2p_listen]
        self.proc = self._spawn(argv)
        give_up = time.monotonic() + SPAWN_READY_S
        while not self.ready_file.exists():
            if self.proc.poll() is not None or time.monotonic() > give_up:
                self.kill()
                raise CoordinatorUnavailable(
                    f"coordinator did not start; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.05)
        info = json.loads(self.ready_file.read_text())
        self.url, self.peer_id = info["url"], info["peer_id"]
        self.p2p_addrs = list(info.get("p2p_addrs", []))
        return self

    def _spawn(self, argv: list[str]) -> ChildProcess:
        """``python -m cnode *argv``, its output appended to the log (tests start it as a fork
        of a process that has imported cnode already: tests/support/forked.py)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap()
        # It ends with whoever started it, even a parent killed with SIGKILL (_children.py).
        return subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "cnode", *argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(),
        )

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> CoordinatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
