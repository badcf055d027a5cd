"""``cnode train --gateway HOST:PORT``: the node's blocks over HTTP too (specs/gateway.md).

HTTP carries no peer id, so the gateway bypasses the run's admission: the operator's explicit
choice, logged as ``gateway_open`` and reported as the ``gateway`` event with its URL. It runs
beside the trio node (``gateway_beside_trio``) and takes its uploads from the node's bucket.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cnode.node.p2p import P2PNode, gateway_beside_trio
from cnode.storage import BlockStore

from .._report import Event, Reporter

__all__ = ["maybe_gateway"]


@asynccontextmanager
async def maybe_gateway(
    address: tuple[str, int] | None, store: BlockStore, node: P2PNode, reporter: Reporter
) -> AsyncIterator[None]:
    """Serve ``store`` as a gateway on ``address`` while the block runs (None: do nothing)."""
    if address is None:
        yield
        return
    async with gateway_beside_trio(store, address[0], address[1], node.server.bucket) as url:
        reporter.event(Event.GATEWAY, url=url)
        yield
