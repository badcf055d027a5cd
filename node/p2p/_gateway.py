"""A trustless HTTP gateway over the block store (specs/gateway.md), served with aiohttp.

``GET``/``HEAD /ipfs/{cid}`` answers one raw block (``application/vnd.ipld.raw``,
``?format=raw``) or a CAR v1 stream of the DAG under the CID (``application/vnd.ipld.car``,
``?format=car``) with ``dag-scope=block|entity|all``, blocks in depth-first order, duplicates
sent once (``dups=n``) or every time (``dups=y``). Nothing is deserialized for the client; every
block sent was verified by the store on read. Uploads pass through ``take(bytes)`` (the node's
upload token bucket) piece by piece, so gateway and libp2p serving share one rate cap.

It runs on asyncio (aiohttp); the libp2p node runs on trio behind ``_bridge.trio_portal``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
import trio
from aiohttp import web

from cnode.storage import (
    CID,
    BlockNotFoundError,
    BlockStore,
    CorruptBlockError,
    InvalidCIDError,
    StorageError,
    block_links,
    car_header,
    car_section,
    is_unixfs_file,
)

from . import limits
from ._bucket import TokenBucket

T = TypeVar("T")

log = structlog.get_logger(__name__)

RAW_TYPE = "application/vnd.ipld.raw"
CAR_TYPE = "application/vnd.ipld.car"
CACHE_CONTROL = "public, max-age=29030400, immutable"
# The identity CID of empty bytes: the spec's probe path (GET /ipfs/bafkqaaa).
PROBE_CID = "bafkqaaa"
# varint(len) + DAG-CBOR {"roots": [bafkqaaa], "version": 1}: the probe's CAR (no blocks).
PROBE_CAR = bytes.fromhex("19a265726f6f747381d82a4500015500006776657273696f6e01")
SCOPES = ("block", "entity", "all")

TakeFn = Callable[[int], Awaitable[None]]


class _HTTPError(Exception):
    """Internal: an answer other than 200, with its status and a plain-text reason."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


@dataclass(frozen=True)
class _Want:
    """What the client asked for: raw block, or a CAR with its scope and dups."""

    car: bool
    scope: str = "all"
    dups: bool = False


def _params(item: str) -> tuple[str, dict[str, str]]:
    media, *rest = (p.strip() for p in item.split(";"))
    params = {}
    for p in rest:
        key, _, value = p.partition("=")
        params[key.strip().lower()] = value.strip().strip('"')
    return media.lower(), params


def _car_variant(version: str | None, order: str | None, dups: str | None, status: int) -> bool:
    """Check CAR version/order/dups; return dups (True = y). ``status`` on an unsupported one."""
    if version not in (None, "", "1"):
        raise _HTTPError(status, f"CAR version {version} is not supported (only version=1)")
    if order not in (None, "", "dfs", "unk"):
        raise _HTTPError(status, f"CAR order={order} is not supported (order=dfs)")
    if dups not in (None, "", "y", "n"):
        raise _HTTPError(status, f"CAR dups={dups} is not valid (y or n)")
    return dups == "y"


def negotiate(query: dict[str, str], accept: str | None) -> _Want:
    """Response format from ``?format=`` (takes precedence) or the Accept header."""
    fmt = query.get("format")
    params: dict[str, str] = {}
    if fmt is not None:
        if fmt not in ("raw", "car"):
            raise _HTTPError(400, f"format={fmt} is not served here (format=raw or format=car)")
        car = fmt == "car"
    else:
        if not accept:
            raise _HTTPError(
                400,
                f"trustless gateway: ask for a block (Accept: {RAW_TYPE}, ?format=raw) or a "
                f"CAR (Accept: {CAR_TYPE}, ?format=car)",
            )
        for item in accept.split(","):
            media, p = _params(item)
            if media in (RAW_TYPE, CAR_TYPE) and p.get("q") not in ("0", "0.0"):
                car, params = media == CAR_TYPE, p
                break
        else:
            raise _HTTPError(
                406, f"not acceptable: this gateway serves only {RAW_TYPE} and {CAR_TYPE}"
            )
    if not car:
        return _Want(car=False)
    if "entity-bytes" in query:
        raise _HTTPError(400, "entity-bytes is not supported by this gateway")
    scope = query.get("dag-scope", "all")
    if scope not in SCOPES:
        raise _HTTPError(400, f"dag-scope={scope} is not valid (block, entity or all)")
    _car_variant(params.get("version"), params.get("order"), params.get("dups"), 406)
    dups = _car_variant(
        query.get("car-version", params.get("version")),
        query.get("car-order", params.get("order")),
        query.get("car-dups", params.get("dups")),
        400,
    )
    return _Want(car=True, scope=scope, dups=dups)


class GatewayServer:
    """The request handlers; :func:`start_gateway` runs them on a TCP site.

    Args:
        store: the blocks served (read through the verifying ``get``).
        take: awaited with a byte count before each piece is sent (the upload cap), or None.
    """

    def __init__(self, store: BlockStore, take: TakeFn | None = None) -> None:
        self.store = store
        self.take = take
        self.slots = asyncio.Semaphore(limits.GATEWAY_MAX_REQUESTS)
        self.requests_served = 0
        self.bytes_sent = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024)
        app.router.add_route("GET", "/ipfs/{cid}", self.handle)
        app.router.add_route("GET", "/ipfs/{cid}/{path:.*}", self.handle)
        app.router.add_route("HEAD", "/ipfs/{cid}", self.handle)
        app.router.add_route("HEAD", "/ipfs/{cid}/{path:.*}", self.handle)
        return app

    async def _get(self, cid: CID) -> bytes | None:
        try:
            return await asyncio.to_thread(self.store.get, cid)
        except BlockNotFoundError:
            return None
        except CorruptBlockError:
            log.warning("gateway_block_corrupt", cid=str(cid), action="quarantined, answered 404")
            return None

    async def _send(self, response: web.StreamResponse, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), limits.SEND_PIECE):
            piece = view[start : start + limits.SEND_PIECE]
            if self.take is not None:
                await self.take(len(piece))
            await response.write(piece)
        self.bytes_sent += len(data)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.slots.locked():
            return _error(429, "too many requests in flight; retry later")
        async with self.slots:
            try:
                return await self._handle(request)
            except _HTTPError as exc:
                log.info("gateway_refused", path=request.path, status=exc.status, reason=exc.text)
                return _error(exc.status, exc.text)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        want = negotiate(dict(request.query), request.headers.get("Accept"))
        text = request.match_info["cid"]
        if request.match_info.get("path"):
            if not want.car:
                raise _HTTPError(400, "a raw block request takes no path: GET /ipfs/{cid}")
            raise _HTTPError(501, "content paths are not supported here; ask for the CID itself")
        if text == PROBE_CID:
            body = PROBE_CAR if want.car else b""
            return web.Response(body=body, headers=self._headers(text, want))
        try:
            cid = CID.parse(text)
        except InvalidCIDError as exc:
            raise _HTTPError(400, f"bad CID {text[:80]!r}: {exc}") from exc
        data = await self._get(cid)
        if data is None:
            raise _HTTPError(404, f"block {cid} is not held by this gateway")
        headers = self._headers(str(cid), want)
        if request.headers.get("If-None-Match") == headers["Etag"]:
            return web.Response(status=304, headers=headers)
        self.requests_served += 1
        if not want.car:
            headers["Content-Length"] = str(len(data))
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        try:
            if request.method == "GET" and not want.car:
                await self._send(response, data)
            elif request.method == "GET":
                await self._send(response, car_header([cid]))
                await self._walk(response, cid, data, want)
            await response.write_eof()
        except ConnectionResetError:  # the client went away mid-answer: nothing to tell it
            log.info("gateway_client_gone", cid=str(cid), sent=self.bytes_sent)
        return response

    async def _walk(
        self, response: web.StreamResponse, root: CID, data: bytes, want: _Want
    ) -> None:
        """Depth-first, links in order; a missing child ends the stream (spec: incomplete CAR)."""
        follow = want.scope == "all" or (want.scope == "entity" and is_unixfs_file(root, data))
        stack: list[tuple[CID, bytes | None]] = [(root, data)]
        seen: set[CID] = set()
        sent = 0
        while stack:
            cid, block = stack.pop()
            if cid in seen and not want.dups:
                continue
            seen.add(cid)
            if block is None:
                block = await self._get(cid)
                if block is None:
                    log.info("gateway_car_incomplete", root=str(root), missing=str(cid))
                    return
            sent += 1
            if sent > limits.GATEWAY_MAX_CAR_BLOCKS:
                log.warning("gateway_car_truncated", root=str(root), blocks=sent - 1)
                return
            await self._send(response, car_section(cid, block))
            if follow:
                try:
                    links = block_links(cid, block)
                except StorageError as exc:
                    log.info("gateway_car_undecodable", cid=str(cid), error=str(exc))
                    links = []
                stack.extend((link, None) for link in reversed(links))

    @staticmethod
    def _headers(cid: str, want: _Want) -> dict[str, str]:
        if want.car:
            dups = "y" if want.dups else "n"
            ctype = f"{CAR_TYPE}; version=1; order=dfs; dups={dups}"
            etag = f'"{cid}.car.{want.scope}.dfs.{dups}"'
            filename = f"{cid}.car"
        else:
            ctype, etag, filename = RAW_TYPE, f'"{cid}.raw"', f"{cid}.bin"
        return {
            "Content-Type": ctype,
            "Content-Disposition": f'attachment; filename="{filename}"',
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": CACHE_CONTROL,
            "Etag": etag,
            "X-Ipfs-Path": f"/ipfs/{cid}",
            "X-Ipfs-Roots": cid,
            "Vary": "Accept",
            "Access-Control-Allow-Origin": "*",
        }


def _error(status: int, text: str) -> web.Response:
    return web.Response(
        status=status,
        text=text + "\n",
        headers={"X-Content-Type-Options": "nosniff", "Vary": "Accept"},
    )


@dataclass
class RunningGateway:
    """A started gateway: its base URL (``http://host:port``) and the runner that stops it."""

    url: str
    server: GatewayServer
    runner: web.AppRunner

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_gateway(
    store: BlockStore, host: str, port: int, take: TakeFn | None = None
) -> RunningGateway:
    """Listen on ``host:port`` (port 0: any free port) and serve ``store`` as a gateway.

    The gateway serves whoever reaches the address: callers make that the operator's explicit
    choice (``cnode checkpoint serve --gateway HOST:PORT --open``) and log it. Stop it with
    ``await gateway.stop()``.
    """
    server = GatewayServer(store, take)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    bound_host, bound_port = runner.addresses[0][:2]
    url = f"http://{bound_host}:{bound_port}"
    log.warning("gateway_open", url=url, note="serves every block held to anyone who asks")
    return RunningGateway(url, server, runner)


@asynccontextmanager
async def gateway_beside_trio(
    store: BlockStore, host: str, port: int, bucket: TokenBucket
) -> AsyncIterator[str]:
    """Trio side: run a gateway in its own asyncio thread while the block runs; yield its URL.

    For a trio program (``cnode train``): aiohttp gets a thread and loop of its own; its
    uploads take from ``bucket`` (the node's, so libp2p and HTTP share one cap) through
    ``trio.from_thread``. Leaving the block stops the gateway, then the loop, then the thread.
    """
    token = trio.lowlevel.current_trio_token()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="cnode-gateway", daemon=True)
    thread.start()

    take: TakeFn | None = None
    if bucket.rate:

        async def take(amount: int) -> None:
            await asyncio.to_thread(trio.from_thread.run, bucket.take, amount, trio_token=token)

    def on_loop(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(limits.GATEWAY_STOP_S)

    try:
        gateway = await trio.to_thread.run_sync(on_loop, start_gateway(store, host, port, take))
        try:
            yield gateway.url
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(on_loop, gateway.stop())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(thread.join, limits.GATEWAY_STOP_S)
        loop.close()
