"""aiohttp servers on 127.0.0.1 in a background asyncio thread (tests only).

Trio tests and plain tests talk to them over real sockets. Every server started here is
stopped when its ``with`` block ends; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from aiohttp import web

from cnode.node.p2p import RunningGateway, start_gateway
from cnode.storage import BlockStore

T = TypeVar("T")
WAIT_S = 10.0


@contextmanager
def asyncio_thread() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-asyncio", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT_S)
        loop.close()


def run_in(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(WAIT_S)


@contextmanager
def gateway_thread(store: BlockStore, take: Any = None) -> Iterator[RunningGateway]:
    """A real cnode gateway (``start_gateway``) on 127.0.0.1, any free port."""
    with asyncio_thread() as loop:
        gateway = run_in(loop, start_gateway(store, "127.0.0.1", 0, take))
        try:
            yield gateway
        finally:
            run_in(loop, gateway.stop())


@contextmanager
def app_thread(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (any free port); yield its base URL."""
    with asyncio_thread() as loop:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)

        async def start() -> str:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            return f"http://{host}:{port}"

        url = run_in(loop, start())
        try:
            yield url
        finally:
            run_in(loop, runner.cleanup())
