"""The one asyncio <-> trio bridge: a libp2p node in its own thread, called from asyncio.

py-libp2p runs on trio; aiohttp (the coordinator) runs on asyncio. The pattern, used everywhere:

* a dedicated thread runs ``trio.run``; inside, the trio-side resource (normally
  ``open_p2p_node(...)``) is entered as an async context manager and kept open;
* asyncio code calls into it with ``await portal.call(async_fn, *args)``, which is
  ``asyncio.to_thread(trio.from_thread.run, async_fn, *args, trio_token=...)``: the asyncio
  loop never blocks, the trio loop runs the call;
* leaving ``async with trio_portal(...)`` stops the trio side (its context manager exits
  normally) and joins the thread.

Example (coordinator)::

    async with trio_portal(lambda: open_p2p_node(identity, store, settings, allow=allow)) as p:
        await p.call(p.value.publish, topic, envelope)

Cancellation: cancelling the asyncio task that awaits ``call`` does not cancel the trio call;
trio-side code bounds its own waits (``trio.fail_after``). Measured loop lag: see DESIGN notes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Generic, TypeVar

import trio

T = TypeVar("T")
R = TypeVar("R")


class TrioPortal(Generic[T]):
    """Handle on a value living in the trio thread; ``value`` is what the factory yielded."""

    def __init__(self, value: T, token: trio.lowlevel.TrioToken, stop: trio.Event) -> None:
        self.value = value
        self._token = token
        self._stop = stop

    async def call(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R:
        """Run ``await fn(*args)`` in the trio thread; return its result or raise its error."""
        return await asyncio.to_thread(trio.from_thread.run, fn, *args, trio_token=self._token)

    def _request_stop(self) -> None:
        # RunFinishedError: the trio side already ended (it failed); join reports why.
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)


@asynccontextmanager
async def trio_portal(
    factory: Callable[[], AbstractAsyncContextManager[T]],
) -> AsyncIterator[TrioPortal[T]]:
    """Enter ``factory()`` in a new trio thread and yield a portal to it (asyncio side)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[TrioPortal[T]] = loop.create_future()
    failure: list[BaseException] = []

    def resolve(portal: TrioPortal[T]) -> None:
        if not ready.done():
            ready.set_result(portal)

    def reject(exc: BaseException) -> None:
        if not ready.done():
            ready.set_exception(exc)

    async def trio_main() -> None:
        stop = trio.Event()
        async with factory() as value:
            portal = TrioPortal(value, trio.lowlevel.current_trio_token(), stop)
            loop.call_soon_threadsafe(resolve, portal)
            await stop.wait()

    def thread_main() -> None:
        try:
            trio.run(trio_main)
        # A catch-all at a thread boundary: whatever ended the trio side is handed to the
        # asyncio side, which raises it (nothing is swallowed; cancellation is not an Exception).
        except Exception as exc:
            failure.append(exc)
            loop.call_soon_threadsafe(reject, exc)
        else:
            loop.call_soon_threadsafe(reject, RuntimeError("trio side ended before start"))

    thread = threading.Thread(target=thread_main, name="cnode-trio-bridge", daemon=True)
    thread.start()
    portal: TrioPortal[T] | None = None
    try:
        portal = await ready
        yield portal
    finally:
        if portal is not None:
            portal._request_stop()
        await asyncio.to_thread(thread.join)
    if failure:
        raise failure[0]
