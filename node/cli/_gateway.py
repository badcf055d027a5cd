"""``cnode checkpoint serve --gateway HOST:PORT``: the block store as a trustless HTTP gateway.

The libp2p node keeps serving ``/cnode/blocks/1.0.0`` (on trio, behind ``trio_portal``) while
aiohttp serves ``/ipfs/{cid}`` (specs/gateway.md) on asyncio. Both take their upload bytes
from the node's one token bucket, so ``--rate`` caps them together. HTTP carries no peer id:
the gateway serves anyone who reaches the address, so it needs ``--open`` (the operator's
explicit choice) and logs ``gateway_open`` at start.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import structlog

from cnode.node._exceptions import UsageError
from cnode.node.p2p import P2PSettings, open_p2p_node, start_gateway, trio_portal
from cnode.storage import CID, BlockStore

log = structlog.get_logger(__name__)


def parse_host_port(text: str, flag: str = "--gateway") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6); UsageError naming ``flag`` if malformed."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{flag} must be HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return host, int(port)


async def serve_with_gateway(
    identity: object,
    store: BlockStore,
    settings: P2PSettings,
    allow: Callable[[str], bool],
    announce: list[CID],
    address: tuple[str, int],
) -> None:
    """Run the node and the gateway until SIGINT/SIGTERM; print ``listening``/``gateway`` lines."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with trio_portal(
        lambda: open_p2p_node(identity, store, settings, allow=allow)  # type: ignore[arg-type]
    ) as portal:
        node = portal.value
        bucket = node.server.bucket
        take: Callable[[int], Awaitable[None]] | None = None
        if bucket.rate:

            async def take(amount: int) -> None:
                await portal.call(bucket.take, amount)

        try:
            gateway = await start_gateway(store, address[0], address[1], take)
        except OSError as exc:
            raise UsageError(f"--gateway: {exc}") from exc
        try:
            for listen in node.listen_addrs:
                print(f"listening {listen}", flush=True)
            print(f"gateway {gateway.url}", flush=True)
            for cid in announce:
                await portal.call(node.announce_hold, cid)
            await stop.wait()
            log.info("serve_stopping", reason="signal")
        finally:
            await gateway.stop()
        log.info(
            "serve_stopped",
            requests=node.server.requests_served,
            bytes_sent=node.server.bytes_sent,
            gateway_requests=gateway.server.requests_served,
            gateway_bytes_sent=gateway.server.bytes_sent,
        )
