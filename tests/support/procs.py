"""Start and stop ``cnode`` subprocesses with bounded waits (tests only).

Every process started through :class:`Procs` is stopped when its ``with`` block ends (SIGTERM,
then SIGKILL after a grace period), whatever the test did. stdout lines are collected by a
reader thread so waits never block forever; stderr (the JSON log) goes to a file the test can
read for evidence.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.forked import start_cnode


class CnodeProc:
    """One running ``python -m cnode ...`` process (a fork of a preloaded one: forked.py)."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str]) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.out_path = log_path.with_suffix(".stdout")
        for path in (log_path, self.out_path):
            path.write_bytes(b"")
        self.proc = start_cnode(["--log-json", *args], env, log_path, stdout=self.out_path)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Follow the stdout file line by line until the process has ended and it is read."""
        with self.out_path.open("rb") as out:
            partial = b""
            while True:
                ended = self.proc.poll() is not None
                chunk = out.readline()
                if chunk:
                    partial += chunk
                    if partial.endswith(b"\n"):
                        self._lines.put(partial.decode("utf-8", errors="replace").rstrip("\n"))
                        partial = b""
                    continue
                if ended:  # polled before this empty read: nothing more will come
                    break
                time.sleep(0.02)
            if partial:
                self._lines.put(partial.decode("utf-8", errors="replace"))
        self._lines.put(None)

    def wait_line(self, prefix: str, timeout: float = 30.0) -> str:
        """The next stdout line starting with ``prefix``; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {prefix!r} line within {timeout} s: {self.describe()}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"process ended before {prefix!r}: {self.describe()}")
            self.stdout.append(line)
            if line.startswith(prefix):
                return line

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for exit (bounded) and drain stdout; return the exit status."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"still running after {timeout} s: {self.describe()}") from exc
        self._reader.join(timeout=5)
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.stdout.append(line)
        return code

    def stop(self, grace: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=grace)
        code = self.proc.returncode
        assert code is not None
        return code

    def kill(self) -> None:
        """SIGKILL now (a holder dying mid-transfer)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def describe(self) -> str:
        tail = self.log_path.read_text(errors="replace")[-2000:]
        return f"cnode {' '.join(self.args)} (rc={self.proc.poll()}); stderr tail:\n{tail}"


class Procs:
    """Starts cnode processes and stops all of them on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: list[CnodeProc] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> CnodeProc:
        full_env = dict(os.environ)
        full_env.update(env or {})
        log_path = self.log_dir / f"proc{len(self.running)}.log"
        proc = CnodeProc(args, log_path, full_env)
        self.running.append(proc)
        return proc

    def holder(
        self, home: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 30.0
    ) -> tuple[CnodeProc, str]:
        """Start ``cnode checkpoint serve`` on 127.0.0.1; return it and its multiaddr."""
        return self.holders([home], *extra, env=env, timeout=timeout)[0]

    def holders(
        self,
        homes: Sequence[Path],
        *extra: str,
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> list[tuple[CnodeProc, str]]:
        """Start one holder per home at once (start-up overlaps); return (proc, multiaddr)s."""
        started = [
            self.start(
                "checkpoint",
                "serve",
                "--home",
                str(home),
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                *extra,
                env=env,
            )
            for home in homes
        ]
        out = []
        for proc in started:
            line = proc.wait_line("listening ", timeout)
            out.append((proc, line.split(" ", 1)[1]))
        return out

    def stop_all(self) -> None:
        for proc in self.running:
            proc.stop()


def wait_until(predicate: Any, what: str, timeout: float = 30.0, step: float = 0.05) -> None:
    """Poll ``predicate()`` until true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


@contextmanager
def procs(log_dir: Path) -> Iterator[Procs]:
    """``with procs(tmp_path) as p:`` every process p started is stopped at the end."""
    p = Procs(log_dir)
    try:
        yield p
    finally:
        p.stop_all()
