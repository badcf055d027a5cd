"""``cnode allowlist add|remove|ls``, ``cnode ban``, ``cnode unban``, ``cnode status``.

Admin commands sign their requests with ``--key`` (default: this node's identity), which must be
the coordinator's key or one of the run's ``access.admins``. ``status`` needs no key: it reads the
signed run state and checks it against the coordinator pinned in the run config.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cnode.auth import AuthError, Identity, load_identity, public_key_from_peer_id
from cnode.node._config import IDENTITY_FILE, default_home, load_config
from cnode.node.coordinator import (
    AllowKind,
    RunConfigError,
    RunState,
    SyncCoordinatorClient,
    load_run_config,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    allow = subparsers.add_parser("allowlist", help="add, remove or list who may join a run")
    asub = allow.add_subparsers(dest="allowlist_command", metavar="ACTION", required=True)
    for name, help_text in (("add", "allow a user/peer/org"), ("remove", "remove an entry")):
        p = asub.add_parser(name, help=help_text)
        p.add_argument("value", help="HF username, peer id or HF org")
        p.add_argument(
            "--kind",
            choices=("auto", *AllowKind),
            default="auto",
            help="what VALUE is (auto: a peer id if it parses as one, else a user)",
        )
        _common(p, admin=True)
        p.set_defaults(handler=_allow_add if name == "add" else _allow_remove)
    ls = asub.add_parser("ls", help="list the allowlist")
    _common(ls, admin=True)
    ls.set_defaults(handler=_allow_ls)

    ban = subparsers.add_parser("ban", help="ban a peer from a run (revokes its token at once)")
    ban.add_argument("peer", help="peer id")
    ban.add_argument("--reason", required=True, help="shown in `cnode status`")
    _common(ban, admin=True)
    ban.set_defaults(handler=_ban)
    unban = subparsers.add_parser("unban", help="lift a ban")
    unban.add_argument("peer", help="peer id")
    _common(unban, admin=True)
    unban.set_defaults(handler=_unban)

    status = subparsers.add_parser("status", help="show a run's verified state: phase, round, bans")
    _common(status, admin=False)
    status.add_argument("--json", action="store_true", help="print the state as JSON")
    status.add_argument(
        "--checkpoints",
        action="store_true",
        help="also list every checkpoint the coordinator recorded (signed history)",
    )
    status.set_defaults(handler=_status)


def _common(p: argparse.ArgumentParser, *, admin: bool) -> None:
    p.add_argument(
        "--run-config",
        type=Path,
        required=True,
        help="the run config (pins run id, coordinator peer id and URL)",
    )
    p.add_argument(
        "--url",
        default=None,
        help="coordinator URL (default: run config, then config.toml coordinator_url)",
    )
    p.add_argument("--home", type=Path, default=None, help="node home (default $CNODE_HOME)")
    if admin:
        p.add_argument(
            "--key", type=Path, default=None, help="admin key file (default: HOME/identity.key)"
        )


def _client(args: argparse.Namespace) -> SyncCoordinatorClient:
    config = load_run_config(args.run_config)
    if not config.coordinator:
        raise RunConfigError(f"{args.run_config} pins no coordinator peer id")
    home = args.home or default_home()
    url = args.url or config.url or load_config(home).coordinator_url
    key_path = getattr(args, "key", None) or home / IDENTITY_FILE
    identity = (
        load_identity(key_path)
        if getattr(args, "key", None) or key_path.exists()
        else Identity.generate()
    )  # status reads need no key; an unused throwaway signs nothing
    return SyncCoordinatorClient(
        url, run=config.run, coordinator=config.coordinator, identity=identity
    )


def _kind(args: argparse.Namespace) -> AllowKind:
    if args.kind != "auto":
        return AllowKind(args.kind)
    try:
        public_key_from_peer_id(args.value)
        return AllowKind.PEER
    except (AuthError, ValueError):
        return AllowKind.USER


def _allow_add(args: argparse.Namespace) -> int:
    kind = _kind(args)
    with _client(args) as c:
        changed = c.allowlist_add(args.value, kind=kind)
    print(f"{kind} {args.value}: {'added' if changed else 'already on the allowlist'}")
    return 0


def _allow_remove(args: argparse.Namespace) -> int:
    kind = _kind(args)
    with _client(args) as c:
        changed = c.allowlist_remove(args.value, kind=kind)
    print(f"{kind} {args.value}: {'removed' if changed else 'was not on the allowlist'}")
    return 0


def _allow_ls(args: argparse.Namespace) -> int:
    with _client(args) as c:
        entries = c.allowlist()
    for e in entries:
        print(f"{e['kind']:5} {e['value']}  (by {e['added_by']})")
    if not entries:
        print("(allowlist is empty)")
    return 0


def _ban(args: argparse.Namespace) -> int:
    with _client(args) as c:
        c.ban(args.peer, args.reason)
    print(f"banned {args.peer}: {args.reason}")
    return 0


def _unban(args: argparse.Namespace) -> int:
    with _client(args) as c:
        c.unban(args.peer)
    print(f"unbanned {args.peer}")
    return 0


def _status(args: argparse.Namespace) -> int:
    with _client(args) as c:
        state = c.run_state()
        history = c.checkpoints() if args.checkpoints else None
    if args.json:
        out = state.to_payload() | {"config": state.config}
        if history is not None:
            out["checkpoints"] = [ck.to_payload() for ck in history]
        print(json.dumps(out, indent=2))
        return 0
    print(format_status(state))
    for ck in history or []:
        hub = f"  hf {ck.hf_repo}@{ck.hf_revision}" if ck.hf_repo else ""
        print(f"  round {ck.round} (epoch {ck.epoch}) {ck.manifest}{hub}")
    return 0


# Members `cnode status` names one per line (the counts cover them all).
STATUS_MEMBERS = 32


def format_status(state: RunState) -> str:
    """The human summary `cnode status` prints (verified state only)."""
    r = state.round
    lines = [
        f"run {state.run}  (coordinator {state.coordinator}, state v{state.version}, signature ok)",
        f"phase {state.phase}  epoch {state.epoch}  round {r.round} {r.status}: "
        f"{r.joined} joined, {r.ready} ready",
    ]
    if state.waiting:
        lines.append(f"waiting: {state.waiting}")
    if state.last_round is not None:
        last = state.last_round
        lines.append(f"last published round {last.round}: {len(last.members)} members")
        # Reachability as the coordinator's dial-back found it: only dialed-back addresses
        # are listed (specs/coordinator.md#reachability).
        public = sum(1 for peer in last.members if last.addrs.get(peer))
        lines.append(f"  {public} public, {len(last.members) - public} outbound-only")
        for peer in last.members[:STATUS_MEMBERS]:
            reach = "public" if last.addrs.get(peer) else "outbound-only"
            lines.append(f"  {peer}  {reach}")
    ck = state.checkpoint
    lines.append(
        "checkpoint: none"
        if ck is None
        else f"checkpoint: round {ck.round} (epoch {ck.epoch}) {ck.manifest}"
        + (f"  hf {ck.hf_repo}@{ck.hf_revision}" if ck.hf_repo else "")
    )
    lines.append(f"bans: {len(state.bans)}")
    for b in state.bans:
        who = f" ({b.username})" if b.username else ""
        lines.append(f"  {b.peer}{who}: {b.reason}  [{b.kind}: {b.decided_by()}]")
    return "\n".join(lines)
