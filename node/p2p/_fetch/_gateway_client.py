"""Fetching blocks from a trustless HTTP gateway (specs/gateway.md#client), with httpx.

A :class:`GatewayHolder` is one holder of the multi-holder scheduler (``_scheduler.Transfer``,
``direct=``): it answers a request for CIDs block by block, in request order, with
``GET /ipfs/{cid}?format=raw`` (``Accept: application/vnd.ipld.raw``) or, in ``car`` mode,
``?format=car&dag-scope=block`` (one block in a CAR v1). The gateway is trusted for nothing:

* every block is hashed against the CID asked for (BadBlockError with both CIDs);
* a 200 answer must have the asked-for media type (an HTML page is PeerProtocolError);
* a CAR must have exactly the asked-for root and exactly one section, that block (a wrong root,
  an extra, missing or other block, a truncated CAR: PeerProtocolError naming it);
* 404 means the gateway lacks the block (another holder is asked); any other status is
  RemoteRefusedError; connection failures are DialError / StreamBroken.

The scheduler drops a gateway for the transfer on any of these errors and logs the evidence.
httpx exceptions stay in this module. No timeout here: the scheduler's no-progress scope
cancels a stalled request (``on_frame`` is called on every piece received, with its size: the
scheduler also drops a gateway under MIN_SOURCE_RATE, a trickle that keeps resetting that timer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx
import structlog

from cnode.storage import (
    CID,
    BlockMismatchError,
    BlockTooLargeError,
    CARError,
    VerifiedBlock,
    read_car,
    verify_received,
)
from cnode.storage import limits as storage_limits

from .. import limits
from .._exceptions import (
    BadBlockError,
    DialError,
    PeerProtocolError,
    RemoteRefusedError,
    StreamBroken,
)

log = structlog.get_logger(__name__)

RAW_TYPE = "application/vnd.ipld.raw"
CAR_TYPE = "application/vnd.ipld.car"
CAR_ACCEPT = f"{CAR_TYPE}; version=1; order=dfs; dups=n"
MODES = ("raw", "car")

OnBlock = Callable[[VerifiedBlock], Awaitable[None]]


def check_gateway_url(url: str) -> str:
    """``url`` without a trailing slash; ValueError unless it is an http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
        raise ValueError(f"gateway must be an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


class GatewayHolder:
    """A trustless gateway as a holder; ``name`` is how the scheduler and logs call it.

    Args:
        url: the gateway's base URL (``https://host[:port][/prefix]``); blocks are fetched from
            ``{url}/ipfs/{cid}``.
        client: the httpx client to use (the caller owns and closes it).
        mode: ``"raw"`` (one raw block per GET) or ``"car"`` (one block per CAR).
    """

    def __init__(self, url: str, client: httpx.AsyncClient, mode: str = "raw") -> None:
        if mode not in MODES:
            raise ValueError(f"gateway mode must be one of {MODES}")
        self.url = check_gateway_url(url)
        self.client = client
        self.mode = mode
        self.name = f"gateway:{self.url}"

    async def request(
        self,
        cids: list[CID],
        on_block: OnBlock,
        on_frame: Callable[[int], None],
        on_block_start: Callable[[CID], None],
    ) -> set[CID]:
        """Fetch ``cids`` in order; ``on_block`` each verified one; return those lacked (404)."""
        lacked: set[CID] = set()
        for cid in cids:
            block = await self._fetch(cid, on_frame, on_block_start)
            if block is None:
                lacked.add(cid)
                continue
            await on_block(block)
        return lacked

    async def _fetch(
        self, cid: CID, on_frame: Callable[[int], None], on_block_start: Callable[[CID], None]
    ) -> VerifiedBlock | None:
        if self.mode == "raw":
            url, accept, media, bound = (
                f"{self.url}/ipfs/{cid}?format=raw",
                RAW_TYPE,
                RAW_TYPE,
                storage_limits.MAX_BLOCK_SIZE,
            )
        else:
            url, accept, media, bound = (
                f"{self.url}/ipfs/{cid}?format=car&dag-scope=block",
                CAR_ACCEPT,
                CAR_TYPE,
                limits.GATEWAY_MAX_BLOCK_CAR,
            )
        try:
            async with self.client.stream("GET", url, headers={"Accept": accept}) as response:
                on_frame(0)
                if response.status_code == 404:
                    return None
                if response.status_code != 200:
                    text = (await response.aread())[:200].decode("utf-8", "replace").strip()
                    raise RemoteRefusedError(
                        f"{self.name} answered HTTP {response.status_code} for {cid}: {text!r}",
                        response.status_code,
                    )
                ctype = response.headers.get("content-type", "")
                if ctype.split(";")[0].strip().lower() != media:
                    raise PeerProtocolError(
                        f"{self.name} answered Content-Type {ctype[:80]!r} for {cid}, not {media} "
                        "(not a trustless gateway, or misconfigured)"
                    )
                on_block_start(cid)
                body = bytearray()
                async for piece in response.aiter_bytes():
                    on_frame(len(piece))
                    body += piece
                    if len(body) > bound:
                        raise PeerProtocolError(f"{self.name} sent over {bound} bytes for {cid}")
        except httpx.ConnectError as exc:
            raise DialError(f"cannot connect to {self.name}: {exc}") from exc
        except httpx.TransportError as exc:
            raise StreamBroken(f"{self.name} broke off while sending {cid}: {exc}") from exc
        data = bytes(body) if self.mode == "raw" else self._from_car(cid, bytes(body))
        return _verify(self.name, cid, data)

    def _from_car(self, cid: CID, body: bytes) -> bytes:
        try:
            roots, sections = read_car(body, max_sections=1)
        except CARError as exc:
            raise PeerProtocolError(f"{self.name} sent a bad CAR for {cid}: {exc}") from exc
        if roots != [cid]:
            shown = [str(r) for r in roots][:2]
            raise PeerProtocolError(f"{self.name} sent a CAR with roots {shown}, asked for {cid}")
        if not sections:
            raise PeerProtocolError(f"{self.name} sent a CAR without the block {cid}")
        got, data = sections[0]
        if got != cid:
            raise PeerProtocolError(f"{self.name} sent a CAR holding block {got}, asked for {cid}")
        return data


def _verify(name: str, cid: CID, data: bytes) -> VerifiedBlock:
    """The one hash of a received block (the store does not hash it again)."""
    try:
        return verify_received(cid, data)
    except BlockTooLargeError as exc:
        raise PeerProtocolError(f"{name} sent a block over MAX_BLOCK_SIZE for {cid}") from exc
    except BlockMismatchError as exc:
        computed = exc.computed
        log.error(
            "gateway_sent_bad_block",
            gateway=name,
            claimed=str(cid),
            computed=str(computed),
            bytes=len(data),
        )
        raise BadBlockError(
            f"{name} sent bytes for {cid} that hash to {computed}",
            claimed=str(cid),
            computed=str(computed),
        ) from exc


def gateway_client() -> httpx.AsyncClient:
    """An httpx client for gateways: no env proxies, no redirects, no own timeouts (the
    scheduler's no-progress scope bounds every request)."""
    return httpx.AsyncClient(
        timeout=None,
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
    )
