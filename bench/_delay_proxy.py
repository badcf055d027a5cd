"""A TCP relay on 127.0.0.1 that delays every byte by a fixed time in each direction.

bench/fetch.py runs it to put a round-trip time between two processes on one machine: this
kernel has no netem, so ``tc`` cannot add delay. Usage::

    python bench/_delay_proxy.py TARGET_PORT ONE_WAY_MS

prints ``port N`` once it listens on 127.0.0.1:N, then relays every connection to
127.0.0.1:TARGET_PORT until killed. Each direction reads what has arrived, holds it for
ONE_WAY_MS and writes it on: a long link with room for whatever is in flight, so only the
endpoints' own flow control (yamux windows) limits what travels. At most RELAY_QUEUE reads are
held per direction (then reading pauses, as a full link would).
"""

from __future__ import annotations

import sys

import trio

READ_SIZE = 256 * 1024
RELAY_QUEUE = 4096


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, delay: float) -> None:
    send, receive = trio.open_memory_channel[tuple[float, bytes]](RELAY_QUEUE)

    async def read() -> None:
        async with send:
            while data := await src.receive_some(READ_SIZE):
                await send.send((trio.current_time() + delay, data))

    async def write() -> None:
        async with receive:
            async for due, data in receive:
                await trio.sleep_until(due)
                await dst.send_all(data)
        await dst.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        nursery.start_soon(write)


async def _relay(client: trio.SocketStream, target: int, delay: float) -> None:
    try:
        upstream = await trio.open_tcp_stream("127.0.0.1", target)
    except OSError:
        await client.aclose()
        return
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, client, upstream, delay)
            nursery.start_soon(_pump, upstream, client, delay)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, BaseExceptionGroup):
        pass  # one side went away: the bench is over with this connection
    finally:
        await client.aclose()
        await upstream.aclose()


async def main(target: int, delay: float) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(f"port {listeners[0].socket.getsockname()[1]}", flush=True)

    async def handle(client: trio.SocketStream) -> None:
        await _relay(client, target, delay)

    await trio.serve_listeners(handle, listeners)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), float(sys.argv[2]) / 1000)
