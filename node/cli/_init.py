"""``cnode init [--hf-login] [--token T] [--home DIR] [--force]``.

Creates the node's home folder: ``identity.key`` (Ed25519, mode 0600), ``config.toml`` and, with
``--hf-login``, ``hf_token`` (mode 0600) and ``hf_binding.cbor`` (the signed {peer id, HF
username, time} binding the coordinator checks). See specs/identity.md#cnode-init.

Everything that can fail (reading the old key and config, asking the Hub who the token belongs
to) happens before the first write, so a failure leaves the home folder as it was. The token is
never printed or logged.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from cnode.auth import (
    HFAccount,
    Identity,
    IdentityError,
    hf_whoami,
    load_identity,
    make_hf_binding,
    resolve_hf_endpoint,
    save_identity,
)
from cnode.node._config import (
    CONFIG_FILE,
    HF_BINDING_FILE,
    HF_TOKEN_FILE,
    IDENTITY_FILE,
    NodeConfig,
    default_home,
    load_config,
    save_config,
)
from cnode.node._exceptions import InitError
from cnode.node._logging import bind_context

log = structlog.get_logger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "init",
        help="create this node's identity and config; --hf-login binds an HF account",
        description=(
            "Create the node's home folder (identity.key, config.toml). Run again, it keeps the "
            "key. With --hf-login, check a Hugging Face token with the Hub (HF_ENDPOINT), store "
            "it at mode 0600 and write a binding of your HF username to this node's peer id."
        ),
    )
    parser.add_argument(
        "--home", type=Path, default=None, help="home folder (default: $CNODE_HOME or ~/.cnode)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing key (the old one is kept as identity.key.bak-<time>)",
    )
    parser.add_argument(
        "--hf-login", action="store_true", help="log in to the Hugging Face Hub and bind the user"
    )
    parser.add_argument(
        "--token",
        default=None,
        help="HF token (visible to other local users in the process list: prefer $HF_TOKEN "
        "or the prompt)",
    )
    parser.set_defaults(handler=run_init)


@dataclass(frozen=True)
class _Plan:
    """What init will write, decided before anything is written."""

    home: Path
    identity: Identity
    replace_key: bool  # a key exists and --force replaces it
    new_key: bool  # no key existed
    config: NodeConfig
    write_config: bool
    account: HFAccount | None
    token: str | None


def _read_token(args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token)
    env = os.environ.get("HF_TOKEN")
    if env:
        return env
    if not sys.stdin.isatty():
        raise InitError(
            "no HF token: pass --token, set HF_TOKEN, or run in a terminal to be prompted"
        )
    try:
        token = getpass.getpass("Hugging Face token (input hidden): ")
    except EOFError as exc:
        raise InitError("no HF token entered") from exc
    if not token.strip():
        raise InitError("no HF token entered")
    return token.strip()


def _plan(args: argparse.Namespace) -> _Plan:
    home: Path = (args.home or default_home()).expanduser()
    if home.exists() and not home.is_dir():
        raise InitError(f"home {home} exists and is not a folder")
    key_path = home / IDENTITY_FILE
    identity: Identity | None = None
    has_key = key_path.exists() or key_path.is_symlink()
    if has_key and not args.force:
        try:
            identity = load_identity(key_path)
        except IdentityError as exc:
            raise InitError(
                f"{exc}; fix it, or run `cnode init --force` to make a new key "
                "(the old file is kept as a backup)"
            ) from exc
    chosen = identity or Identity.generate()
    bind_context(peer=chosen.peer_id_str)  # every log line from here on carries the peer id
    config_path = home / CONFIG_FILE
    config = load_config(home)  # ConfigError (clear, names the file) if it is broken
    account = token = None
    if args.hf_login:
        token = _read_token(args)
        endpoint = resolve_hf_endpoint(None)
        log.info("hf_whoami", endpoint=endpoint)
        account = hf_whoami(token, endpoint)
        config = config.with_changes(hf_username=account.username)
    return _Plan(
        home=home,
        identity=chosen,
        replace_key=identity is None and has_key,
        new_key=not has_key,
        config=config,
        write_config=not config_path.exists() or args.hf_login,
        account=account,
        token=token,
    )


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically with ``mode`` (temp file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _backup_key(key_path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    backup = key_path.with_name(f"{key_path.name}.bak-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = key_path.with_name(f"{key_path.name}.bak-{stamp}-{n}")
    # A hard link keeps the old bytes and mode (0600 or not) without ever reading the key.
    os.link(key_path, backup, follow_symlinks=False)
    return backup


def _apply(plan: _Plan) -> None:
    home = plan.home
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    key_path = home / IDENTITY_FILE
    peer = plan.identity.peer_id_str
    if plan.replace_key:
        backup = _backup_key(key_path)
        save_identity(plan.identity, key_path)
        log.info("identity_replaced", path=str(key_path), backup=str(backup))
        print(f"Replaced the key in {key_path}; the old one is kept as {backup}")
    elif plan.new_key:
        save_identity(plan.identity, key_path)
        log.info("identity_created", path=str(key_path))
        print(f"Created a new key in {key_path}")
    else:
        log.info("identity_kept", path=str(key_path))
        print(f"Kept the existing key in {key_path} (use --force to replace it)")
    if plan.write_config:
        path = save_config(home, plan.config)
        log.info("config_written", path=str(path))
        print(f"Wrote {path}")
    else:
        print(f"Kept the existing {home / CONFIG_FILE}")
    if plan.account is not None and plan.token is not None:
        _write_private(home / HF_TOKEN_FILE, plan.token.encode())
        binding = make_hf_binding(plan.identity, plan.account.username, int(time.time()))
        _write_private(home / HF_BINDING_FILE, binding, mode=0o644)
        orgs = ", ".join(plan.account.orgs) or "none"
        log.info("hf_login", username=plan.account.username, orgs=plan.account.orgs)
        print(f"Logged in to Hugging Face as {plan.account.username} (orgs: {orgs})")
        print(f"Wrote the signed binding {home / HF_BINDING_FILE}")
    print(f"peer id: {peer}")


def run_init(args: argparse.Namespace) -> int:
    plan = _plan(args)
    try:
        _apply(plan)
    except OSError as exc:
        raise InitError(f"cannot write to {plan.home}: {exc.strerror or exc}") from exc
    return 0
