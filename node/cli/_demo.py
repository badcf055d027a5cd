"""``cnode demo``: run a whole swarm on this machine and report what it did (``make demo``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cnode.node._exceptions import UsageError
from cnode.node._new_run import NEW_RUN_CODEC

if TYPE_CHECKING:
    from cnode.node.train import DemoSettings

__all__ = ["register"]

# The late joiner starts after this round; in a shorter run, two rounds before the last (at
# least 1): a node that joins once a round is published lands in the round after the next
# (DISCO's rule for late comers: the next one's list may be closed already), so it needs two
# rounds left to play one.
LATE_AFTER = 3


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo",
        help="run a local swarm: coordinator, 4 honest nodes, a late joiner, an attacker",
        description=(
            "Start a coordinator, four honest nodes, one attacker (a testing aid that sends "
            "poisoned updates) and, a few rounds in, one late joiner, each its own process on "
            "this machine. Show the run live, then report the held-out loss per round, the late "
            "joiner's catch-up, the ban with its evidence and the final state CID of every "
            "honest node. Every figure comes from the run."
        ),
    )
    parser.add_argument("--rounds", type=int, default=8, help="rounds to train (default 8)")
    parser.add_argument(
        "--workdir", type=Path, help="keep keys, stores, logs and events here (default: temp)"
    )
    parser.add_argument(
        "--attack", default="gaussian", help="what the attacker sends (default gaussian)"
    )
    parser.add_argument(
        "--late-after",
        type=int,
        help=f"start the late joiner after this round (default {LATE_AFTER}, or --rounds - 2 "
        "when that is smaller, at least 1)",
    )
    parser.add_argument(
        "--codec",
        default=NEW_RUN_CODEC,
        choices=("f32", "bf16", "int8-blockwise", "sparse-topk"),
        help=f"how updates travel: the run's training.update_codec, with the settings a new run "
        f"gets for it (default {NEW_RUN_CODEC})",
    )
    parser.set_defaults(handler=_handle)


def demo_settings(args: argparse.Namespace) -> DemoSettings:
    """The demo's settings from its arguments; UsageError naming the argument that is wrong."""
    from cnode.node.train import DemoSettings

    if args.rounds < 2:
        raise UsageError(
            f"--rounds must be >= 2 (a late joiner needs a round to join), not {args.rounds}"
        )
    late = max(1, min(LATE_AFTER, args.rounds - 2)) if args.late_after is None else args.late_after
    if not 1 <= late < args.rounds:
        raise UsageError(
            f"--late-after must be at least 1 and below --rounds ({args.rounds}), not {late}"
        )
    return DemoSettings(
        workdir=args.workdir,
        rounds=args.rounds,
        late_after_round=late,
        attack=args.attack,
        codec=args.codec,
    )


def _handle(args: argparse.Namespace) -> int:
    from rich.console import Console

    from cnode.node._children import exit_on_sigterm
    from cnode.node.train import run_demo

    settings = demo_settings(args)
    # SIGTERM ends the demo as Ctrl-C does: its finally blocks stop the coordinator and the
    # nodes (which also end by themselves if the demo is killed outright: _children.py).
    exit_on_sigterm()
    return run_demo(settings, Console())
