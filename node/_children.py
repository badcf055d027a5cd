"""Child processes that end with their parent, whatever ends the parent.

``cnode demo`` starts a coordinator and node processes; tests and benches start more. A parent
killed by a signal runs no clean-up code (SIGKILL never does; SIGTERM does not by default), so
each child asks the kernel to send it SIGTERM when its parent dies (Linux ``prctl
PR_SET_PDEATHSIG``, through ctypes, in the child between fork and exec), and a parent that
starts children turns SIGTERM into an orderly exit (:func:`exit_on_sigterm`) so its own
``finally`` blocks stop them first.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["die_with_parent", "exit_on_sigterm"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets SIGTERM when the process
    that started it dies. None off Linux (no such call; the parent's handlers must do)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arm() -> None:
        # Runs in the child after fork, before exec: only async-signal-safe work here.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nobody will tell us
            os._exit(1)

    return arm


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit(143) in the main thread, so ``finally`` blocks run
    (and stop the children) as they do for Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
