"""``cnode demo``: run a whole swarm on this machine and report what it did (``make demo``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cnode.node._exceptions import UsageError

__all__ = ["register"]


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
        "--late-after", type=int, default=3, help="start the late joiner after this round"
    )
    parser.add_argument(
        "--codec",
        default="int8-blockwise",
        choices=("f32", "bf16", "int8-blockwise", "sparse-topk"),
        help="how updates travel: the run's training.update_codec (default int8-blockwise)",
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from rich.console import Console

    from cnode.node.train import DemoSettings, run_demo

    if args.rounds < 2 or not 1 <= args.late_after < args.rounds:
        raise UsageError("--rounds must be >= 2 and 1 <= --late-after < --rounds")
    settings = DemoSettings(
        workdir=args.workdir,
        rounds=args.rounds,
        late_after_round=args.late_after,
        attack=args.attack,
        codec=args.codec,
    )
    return run_demo(settings, Console())
