"""``cnode checkpoint fetch CID [--peer MULTIADDR ...] [--gateway URL ...]``: fetch a checkpoint.

Holders are libp2p peers and trustless HTTP gateways (specs/gateway.md), mixed freely: they
share one multi-holder scheduler, so a slow or bad source's work moves to the others.

Every block is verified against its CID before it is stored. Resumable: blocks already in the
store are not fetched again, so re-running after an interruption fetches only what is missing.
Progress (bytes, MB/s, holders in use) goes to stderr; a summary line to stdout.
"""

from __future__ import annotations

import argparse
from typing import Any

import structlog
import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from cnode.node._exceptions import UsageError
from cnode.node.p2p import (
    DialError,
    FetchProgress,
    FetchReport,
    GatewayHolder,
    P2PSettings,
    check_gateway_url,
    gateway_client,
    open_p2p_node,
)
from cnode.storage import limits as storage_limits

from ._serve import add_home, check_peers, connect_all, open_home, parse_cid

log = structlog.get_logger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fetch",
        help="fetch a checkpoint from peers, verifying every block",
        description="Fetch MANIFEST_CID and all its blocks from peers into the block store.",
    )
    p.add_argument("manifest", metavar="MANIFEST_CID")
    p.add_argument("--peer", action="append", default=[], help="holder multiaddr (repeatable)")
    p.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="URL",
        help="trustless HTTP gateway to fetch from, e.g. http://127.0.0.1:8080 (repeatable)",
    )
    p.add_argument(
        "--gateway-format",
        choices=("raw", "car"),
        default="raw",
        help="ask gateways for raw blocks or one-block CARs (default: %(default)s)",
    )
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="our listen multiaddr")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_home(p)
    p.set_defaults(handler=_fetch)


def _fetch(args: argparse.Namespace) -> int:
    root = parse_cid(args.manifest)
    check_peers(list(args.peer))  # before anything is opened: a bad --peer is the user's input
    _home, config, identity, store = open_home(args)
    for url in args.gateway:
        try:
            check_gateway_url(url)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    gateways_given = bool(args.gateway)
    peers = list(args.peer) or ([] if gateways_given else list(config.bootstrap))
    if not peers and not args.gateway:
        raise UsageError(
            "no peers to fetch from: give --peer MULTIADDR or --gateway URL (or config bootstrap)"
        )
    check_peers(peers)  # config bootstrap too
    settings = P2PSettings(listen=(args.listen,))
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("[bold]fetch"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[holders]} holders · {task.fields[pending]} blocks left"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=args.quiet or not console.is_terminal,
    )

    async def main() -> FetchReport:
        # Nobody fetches from a fetch-only node; refuse them all.
        async with (
            open_p2p_node(identity, store, settings, allow=lambda _peer: False) as node,
            gateway_client() as client,
        ):
            holders: list[str] = []
            if peers:
                try:
                    holders = await connect_all(node, peers)
                except DialError:
                    if not gateways_given:
                        raise
                    log.warning("no_peer_reached", fallback="gateways only")
            gateways = [GatewayHolder(u, client, args.gateway_format) for u in args.gateway]
            with progress:
                task = progress.add_task("fetch", total=None, holders=0, pending="?")

                def show(p: FetchProgress) -> None:
                    estimate = p.bytes + p.pending * storage_limits.MAX_BLOCK_SIZE
                    progress.update(
                        task,
                        completed=p.bytes,
                        total=estimate,
                        holders=p.holders_in_use,
                        pending=p.pending,
                    )

                return await node.fetch(root, holders, progress=show, gateways=gateways)

    report = trio.run(main)
    print(
        f"fetched {root}: {report.blocks} blocks, {report.bytes / 1e6:.1f} MB in "
        f"{report.seconds:.1f} s ({report.mb_per_s:.1f} MB/s) from "
        f"{len(report.per_holder_bytes)} holders",
        flush=True,
    )
    for peer, reason in report.dropped.items():
        print(f"dropped holder {peer}: {reason}", flush=True)
    return 0
