"""``cnode checkpoint fetch MANIFEST_CID [--peer MULTIADDR ...]``: fetch a checkpoint from peers.

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
from cnode.node.p2p import FetchProgress, FetchReport, P2PSettings, open_p2p_node
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
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="our listen multiaddr")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_home(p)
    p.set_defaults(handler=_fetch)


def _fetch(args: argparse.Namespace) -> int:
    root = parse_cid(args.manifest)
    check_peers(list(args.peer))  # before anything is opened: a bad --peer is the user's input
    _home, config, identity, store = open_home(args)
    peers = list(args.peer) or list(config.bootstrap)
    if not peers:
        raise UsageError("no peers to fetch from: give --peer MULTIADDR (or config bootstrap)")
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
        async with open_p2p_node(identity, store, settings, allow=lambda _peer: False) as node:
            holders = await connect_all(node, peers)
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

                return await node.fetch(root, holders, progress=show)

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
