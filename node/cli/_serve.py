"""``cnode checkpoint serve``: hold the node's block store and serve it over /cnode/blocks/1.0.0.

Prints ``listening MULTIADDR`` lines on stdout once the host is up (scripts and tests read them),
then serves until SIGINT/SIGTERM. With ``--run`` and ``--announce CID`` it announces the
manifests it holds on the run's topic.

TESTING AID: the environment variable ``CNODE_TESTING_CORRUPT_UPLOADS=1`` makes this holder
flip a byte of every block it sends, so tests can check that fetchers reject and report it.
Never set it outside tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import structlog
import trio

from cnode.auth import AuthError, Identity, load_identity
from cnode.node._config import IDENTITY_FILE, NodeConfig, default_home, load_config
from cnode.node._exceptions import ConfigError, UsageError
from cnode.node._logging import bind_context
from cnode.node.p2p import (
    DialError,
    P2PNode,
    P2PSettings,
    check_peer_address,
    limits,
    open_p2p_node,
)
from cnode.storage import CID, BlockStore, InvalidCIDError

log = structlog.get_logger(__name__)

CORRUPT_ENV = "CNODE_TESTING_CORRUPT_UPLOADS"
# Seconds to connect to one peer named with --peer (fetch, verify --replay).
CONNECT_S = 10.0


def add_home(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--home", default=str(default_home()), help="node home folder (default: %(default)s)"
    )


def open_home(args: argparse.Namespace) -> tuple[Path, NodeConfig, Identity, BlockStore]:
    """The home folder, its config, the node identity (ephemeral if none) and block store.

    Binds the node's peer id into the log context: every log line after this carries it.
    """
    home = Path(args.home).expanduser()
    config = load_config(home)
    key = home / IDENTITY_FILE
    ephemeral = not key.exists()
    if ephemeral:
        identity = Identity.generate()
    else:
        try:
            identity = load_identity(key)
        except AuthError as exc:
            raise ConfigError(f"cannot load {key}: {exc}") from exc
    bind_context(peer=identity.peer_id_str)
    if ephemeral:
        log.info("ephemeral_identity", reason=f"no {key}; run `cnode init` for a lasting one")
    return home, config, identity, BlockStore(config.blocks_dir(home))


def check_peers(addresses: list[str]) -> None:
    """UsageError saying what is wrong with the first bad peer address; nothing is dialled."""
    for address in addresses:
        try:
            check_peer_address(address)
        except DialError as exc:
            raise UsageError(str(exc)) from exc


async def connect_all(node: P2PNode, addresses: list[str]) -> list[str]:
    """Dial every address (bounded each); return the peer ids reached.

    Every address is checked first (:func:`check_peers`). DialError if none could be reached.
    """
    check_peers(addresses)
    reached = []
    for address in addresses:
        try:
            with trio.fail_after(CONNECT_S):
                reached.append(await node.connect(address))
        except (DialError, trio.TooSlowError) as exc:
            log.warning("peer_unreachable", address=address, error=str(exc))
    if not reached:
        raise DialError(f"none of the {len(addresses)} peers could be reached")
    return reached


def parse_cid(text: str) -> CID:
    try:
        return CID.parse(text)
    except InvalidCIDError as exc:
        raise UsageError(f"{text!r} is not a CID: {exc}") from exc


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the block store to peers until interrupted",
        description="Hold the node's block store and serve its blocks to allowed peers.",
    )
    add_home(p)
    p.add_argument("--listen", action="append", help="multiaddr to listen on (repeatable)")
    p.add_argument("--bootstrap", action="append", default=[], help="multiaddr to dial first")
    p.add_argument("--rate", type=int, help="upload cap in bytes/s (0 = none; default: config)")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--open", action="store_true", help="serve any peer that asks")
    who.add_argument("--allow-peer", action="append", help="serve only this peer id (repeatable)")
    p.add_argument("--run", help="run id whose announcement topic to join")
    p.add_argument("--announce", action="append", default=[], help="manifest CID to announce")
    p.add_argument(
        "--gateway",
        metavar="HOST:PORT",
        help="also serve blocks over HTTP as a trustless gateway (specs/gateway.md; needs --open)",
    )
    p.set_defaults(handler=_serve)


def upload_rate_problem(rate: int) -> str | None:
    """Why an upload cap of ``rate`` bytes/s cannot serve anyone, or None (0 is no cap).

    Fetchers drop a holder that delivers under MIN_SOURCE_RATE (specs/blocks.md, 13a), so a cap
    below it would have this node dropped as "too slow" by every fetcher it serves.
    """
    if 0 < rate < limits.MIN_SOURCE_RATE:
        return (
            f"must be 0 (no cap) or at least MIN_SOURCE_RATE ({limits.MIN_SOURCE_RATE} bytes/s), "
            f"got {rate}: fetchers drop a holder slower than that"
        )
    return None


def _serve(args: argparse.Namespace) -> int:
    _home, config, identity, store = open_home(args)
    rate = config.upload_rate_bytes_per_s if args.rate is None else args.rate
    if rate < 0:
        raise UsageError("--rate must be >= 0")
    problem = upload_rate_problem(rate)
    if problem:
        where = "--rate" if args.rate is not None else "upload_rate_bytes_per_s (config.toml)"
        raise UsageError(f"{where} {problem}")
    announce = [parse_cid(text) for text in args.announce]
    if announce and not args.run:
        raise UsageError("--announce needs --run")
    corrupt = os.environ.get(CORRUPT_ENV) == "1"
    if corrupt:
        log.warning("TESTING_AID_corrupting_uploads", env=CORRUPT_ENV)
    settings = P2PSettings(
        listen=tuple(args.listen or [config.listen]),
        bootstrap=tuple(args.bootstrap or config.bootstrap),
        upload_rate_bytes_per_s=rate,
        run_id=args.run,
        corrupt_uploads_for_tests=corrupt,
    )
    allowed = set(args.allow_peer or ())

    def allow(peer: str) -> bool:
        return bool(args.open) or peer in allowed

    if args.gateway:
        from ._gateway import parse_host_port, serve_with_gateway

        address = parse_host_port(args.gateway)
        if not args.open:
            raise UsageError(
                "--gateway serves every block to anyone who reaches HOST:PORT (HTTP carries no "
                "peer id): give --open to choose that explicitly"
            )
        asyncio.run(serve_with_gateway(identity, store, settings, allow, announce, address))
        return 0

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with open_p2p_node(identity, store, settings, allow=allow) as node:
                for address in node.listen_addrs:
                    print(f"listening {address}", flush=True)
                for cid in announce:
                    await node.announce_hold(cid)
                async for signum in signals:
                    log.info("serve_stopping", signal=signal.Signals(signum).name)
                    break
                log.info(
                    "serve_stopped",
                    requests=node.server.requests_served,
                    bytes_sent=node.server.bytes_sent,
                )

    trio.run(main)
    return 0
