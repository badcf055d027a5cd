"""The ``cnode`` command line.

Each command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``handler=`` to a function ``(args) -> int``. Commands in the ``checkpoint``
group register into that group's subparsers instead. To add a command, write the module and add it
to one of the two lists below.

Errors: a :class:`cnode.CnodeError` is printed as one line on stderr with exit status 1; a usage
error exits 2; ``--debug`` shows the traceback as well.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType

from cnode import CnodeError, __version__
from cnode.node._logging import configure_logging

from . import _admin, _checkpoint, _coordinator, _demo, _fetch, _init, _serve, _train

# Modules with a register(subparsers) for top-level commands, in the order --help lists them.
_TOP_LEVEL: list[ModuleType] = [_init, _coordinator, _admin, _train, _demo]
# Modules with a register(subparsers) for `cnode checkpoint ...` subcommands.
_CHECKPOINT: list[ModuleType] = [_checkpoint, _fetch, _serve]


def _command_modules() -> tuple[list[ModuleType], list[ModuleType]]:
    return _TOP_LEVEL, _CHECKPOINT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cnode",
        description="Train one neural network together with peers you do not trust.",
    )
    parser.add_argument("--version", action="version", version=f"cnode {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    top_level, checkpoint = _command_modules()
    for module in top_level:
        module.register(sub)
    if checkpoint:
        group = sub.add_parser(
            "checkpoint",
            help="verify, list, fetch, export and import content-addressed checkpoints",
            description="Work with checkpoints stored as content-addressed blocks.",
        )
        group_sub = group.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
        for module in checkpoint:
            module.register(group_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the chosen command and return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(json=args.log_json, level="debug" if args.debug else "info")
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except CnodeError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"cnode: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cnode: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
