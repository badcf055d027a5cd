"""The ``cnode`` command line.

Each command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``handler=`` to a function ``(args) -> int``. Commands in the ``checkpoint``
group register into that group's subparsers instead. To add a command, write the module and add it
to one of the two lists below.

Errors: a :class:`cnode.CnodeError`, or an ``OSError`` that escaped a command, is printed as one
line on stderr with exit status 1; a usage error exits 2; ``--debug`` shows the traceback as well.

Logging: JSON lines with ``--log-json`` or when the home's ``config.toml`` says
``log_format = "json"``, console lines otherwise. For commands with ``--home`` whose home holds a
key, every line carries that node's peer id.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import structlog

from cnode import CnodeError, __version__
from cnode.auth import AuthError, load_identity
from cnode.node._config import IDENTITY_FILE, default_home, load_config
from cnode.node._exceptions import ConfigError
from cnode.node._logging import bind_context, configure_logging

from . import _admin, _checkpoint, _coordinator, _demo, _fetch, _init, _serve, _train

__all__ = ["build_parser", "main", "run"]

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


def _home(args: argparse.Namespace) -> Path:
    home = getattr(args, "home", None)
    return Path(home).expanduser() if home else default_home()


def _log_json(args: argparse.Namespace, home: Path) -> bool:
    """``--log-json``, else the home's ``log_format`` (a missing or bad config means console)."""
    if args.log_json:
        return True
    try:
        return load_config(home).log_format == "json"
    except (ConfigError, OSError):
        return False  # the command itself reports a bad config if it needs one


def _bind_home_peer(args: argparse.Namespace, home: Path) -> None:
    """Bind the node's peer id to every log line, for commands that work on a node's home."""
    if not hasattr(args, "home"):
        return  # e.g. the coordinator, which binds its own key
    try:
        identity = load_identity(home / IDENTITY_FILE) if (home / IDENTITY_FILE).is_file() else None
    except (AuthError, OSError):
        return  # no usable key yet (`cnode init` is how one gets made or replaced)
    if identity is not None:
        bind_context(peer=identity.peer_id_str)


def _os_error_line(exc: OSError) -> str:
    """``No such file or directory: /x/y`` rather than ``[Errno 2] ... '/x/y'``."""
    text = exc.strerror or str(exc)
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"{text}: {' -> '.join(paths)}" if paths else text


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the chosen command and return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    home = _home(args)
    configure_logging(json=_log_json(args, home), level="debug" if args.debug else "info")
    structlog.contextvars.clear_contextvars()  # nothing bound by an earlier main() in-process
    _bind_home_peer(args, home)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except CnodeError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"cnode: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file error no layer translated: still one line, not a traceback
        if args.debug:
            traceback.print_exc()
        print(f"cnode: error: {_os_error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cnode: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
