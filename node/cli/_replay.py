"""``cnode checkpoint verify --replay MANIFEST [--peer MULTIADDR ...]``: recompute a checkpoint.

With ``--peer``, first fetches from those peers (every block verified) what the replay needs and
the store lacks: the checkpoint, its parent, the signed update headers and the updates. Then
recomputes every round the checkpoint's aggregation record names, and compares each layer's CIDs
with the manifest's. See specs/training.md#replay.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import structlog
import trio
from rich.console import Console

from cnode.node.p2p import FetchError, P2PError, P2PSettings, open_p2p_node
from cnode.storage import CID, BlockStore

from ._serve import check_peers, connect_all, open_home

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ReplayOutcome:
    """What the replay part of ``verify --replay`` found."""

    ok: bool
    message: str  # one line for people
    layer: str | None = None  # the first layer that differs, on a mismatch
    fetched_blocks: int = 0
    fetched_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "message": self.message,
            "layer": self.layer,
            "fetched_blocks": self.fetched_blocks,
            "fetched_bytes": self.fetched_bytes,
        }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replay",
        action="store_true",
        help="also recompute the checkpoint from its parent and the signed updates it names",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="with --replay: fetch what the store lacks from this peer (repeatable)",
    )
    parser.add_argument(
        "--listen", default="/ip4/127.0.0.1/tcp/0", help="our listen multiaddr (with --peer)"
    )


def fetch_inputs(args: argparse.Namespace, store: BlockStore, manifest: CID) -> tuple[int, int]:
    """Fetch the replay's inputs from ``--peer``; return (blocks, bytes) fetched."""
    # torch comes with cnode.node.train: imported here, so other commands start fast.
    from cnode.node.train import fetch_replay_inputs

    check_peers(list(args.peer))
    _home, _config, identity, _ = open_home(args)

    async def main() -> tuple[int, int]:
        settings = P2PSettings(listen=(args.listen,))
        # A verifier serves nobody.
        async with open_p2p_node(identity, store, settings, allow=lambda _peer: False) as node:
            holders = await connect_all(node, list(args.peer))
            got = await fetch_replay_inputs(node, manifest, holders)
            return got.blocks, got.bytes

    console = Console(stderr=True)
    with console.status(f"fetching what the replay of {manifest} needs", spinner="dots"):
        try:
            return trio.run(main)
        except FetchError as exc:
            raise P2PError(f"cannot fetch what the replay needs: {exc}") from exc


def replay(store: BlockStore, manifest: CID, *, fetched: tuple[int, int]) -> ReplayOutcome:
    """Recompute ``manifest`` from the store; a mismatch or a missing input is a failed outcome."""
    from cnode.node.train import CatchUpError, PeerUpdateError, ReplayMismatchError
    from cnode.node.train import replay_checkpoint as recompute

    blocks, size = fetched
    try:
        report = recompute(store, manifest)
    except ReplayMismatchError as exc:
        return ReplayOutcome(False, f"replay FAILED: {exc}", exc.layer, blocks, size)
    except (CatchUpError, PeerUpdateError) as exc:
        hint = "" if blocks else " (give --peer MULTIADDR to fetch it from a peer)"
        return ReplayOutcome(False, f"replay impossible: {exc}{hint}", None, blocks, size)
    return ReplayOutcome(True, report.describe(), None, blocks, size)
