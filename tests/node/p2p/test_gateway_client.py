"""node/p2p/_fetch/_gateway_client.py: fetching through trustless gateways, good, slow and bad.

Bad gateways are real aiohttp servers on 127.0.0.1 that break the trustless gateway spec in one
way each (a block with wrong bytes, HTML in place of a block, a CAR with a wrong root, an extra
block, a truncated CAR, a 404 mid-transfer). Each ends in a clear error or a switch to another
source, and nothing bad is stored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio
from aiohttp import web

from cnode.auth import Identity
from cnode.node.p2p import (
    FetchError,
    FetchReport,
    GatewayHolder,
    P2PSettings,
    gateway_client,
    limits,
    open_p2p_node,
)
from cnode.storage import (
    CID,
    RAW,
    BlockStore,
    CheckpointMeta,
    car_header,
    car_section,
    compute_cid,
    load_checkpoint,
    missing_blocks,
    save_checkpoint,
    verify_checkpoint,
)
from tests.support.http import app_thread, gateway_thread

from .conftest import make_tensors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RAW_TYPE = "application/vnd.ipld.raw"
CAR_TYPE = "application/vnd.ipld.car; version=1; order=dfs; dups=n"
TRICKLE_S = 0.2  # the "trickle" gateway: 5 bytes/s (issue 29's was 1 byte per 5 s)


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> tuple[BlockStore, CID]:
    store = BlockStore(tmp_path_factory.mktemp("origin") / "blocks")
    return store, save_checkpoint(store, make_tensors(), CheckpointMeta(run_id="gw-client"))


def fetch_via(store: BlockStore, root: CID, gateways: list[tuple[str, str]]) -> FetchReport:
    """A real fetch-only node fetching ``root`` from these (url, mode) gateways (bounded)."""

    async def main() -> FetchReport:
        settings = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))
        with trio.fail_after(60):
            async with (
                open_p2p_node(Identity.generate(), store, settings, allow=lambda _p: False) as node,
                gateway_client() as client,
            ):
                holders = [GatewayHolder(url, client, mode) for url, mode in gateways]
                return await node.fetch(root, [], gateways=holders)

    return trio.run(main)


def _bad_app(store: BlockStore, behaviour: str) -> web.Application:
    """A gateway over ``store`` that misbehaves as ``behaviour`` says."""
    served = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal served
        cid = CID.parse(request.match_info["cid"])
        served += 1
        if not store.has(cid) or (behaviour == "404-mid" and served > 3):
            return web.Response(status=404, text="not found")
        data = store.get(cid)
        if behaviour == "html":
            return web.Response(text="<html><body>Welcome to nginx!</body></html>",
                                content_type="text/html")  # fmt: skip
        if behaviour == "slow":
            await asyncio.sleep(0.5)
        if behaviour == "trickle":  # the right bytes, one per TRICKLE_S, until the client goes
            response = web.StreamResponse(
                headers={"Content-Type": RAW_TYPE, "Content-Length": str(len(data))}
            )
            await response.prepare(request)
            for i in range(len(data)):
                await asyncio.sleep(TRICKLE_S)
                await response.write(data[i : i + 1])
            return response
        if behaviour == "wrong-bytes" and cid.codec == RAW:
            data = data[:-1] + bytes([data[-1] ^ 1])
        if request.query.get("format") != "car":
            return web.Response(body=data, headers={"Content-Type": RAW_TYPE})
        body = car_header([cid]) + car_section(cid, data)
        if behaviour == "car-wrong-root":
            body = car_header([compute_cid(b"other")]) + car_section(cid, data)
        elif behaviour == "car-extra-block":
            extra = compute_cid(b"extra")
            body += car_section(extra, b"extra")
        elif behaviour == "car-truncated":
            body = body[:-100]
        elif behaviour == "car-missing-block":
            body = car_header([cid])
        return web.Response(body=body, headers={"Content-Type": CAR_TYPE})

    app = web.Application()
    app.router.add_get("/ipfs/{cid}", handle)
    return app


@pytest.fixture
def servers() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _nothing_bad_stored(store: BlockStore) -> None:
    for cid in store.iter_cids():
        assert store.check(cid)[0] == "ok", cid


def test_fetch_from_one_good_gateway_raw_and_car(
    origin: tuple[BlockStore, CID], tmp_path: Path, servers: ExitStack
) -> None:
    src, root = origin
    gateway = servers.enter_context(gateway_thread(src))
    for mode in ("raw", "car"):
        store = BlockStore(tmp_path / mode)
        report = fetch_via(store, root, [(gateway.url, mode)])
        assert missing_blocks(store, root) == [] and verify_checkpoint(store, root).ok
        assert report.per_holder_bytes == {f"gateway:{gateway.url}": report.bytes}
        tensors, _ = load_checkpoint(store, root)
        assert set(tensors) == set(make_tensors())


BAD = [
    ("wrong-bytes", "raw", "hash to"),
    ("html", "raw", "Content-Type 'text/html"),
    ("car-wrong-root", "car", "CAR with roots"),
    ("car-extra-block", "car", "more than the 1 blocks"),
    ("car-truncated", "car", "truncated CAR"),
    ("car-missing-block", "car", "without the block"),
]


@pytest.mark.parametrize(("behaviour", "mode", "evidence"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_gateway_alone_is_a_clear_error_and_stores_nothing_bad(
    origin: tuple[BlockStore, CID],
    tmp_path: Path,
    servers: ExitStack,
    behaviour: str,
    mode: str,
    evidence: str,
) -> None:
    src, root = origin
    url = servers.enter_context(app_thread(_bad_app(src, behaviour)))
    store = BlockStore(tmp_path / "joiner")
    with pytest.raises(FetchError, match="could not be fetched") as info:
        fetch_via(store, root, [(url, mode)])
    assert evidence in str(info.value)
    _nothing_bad_stored(store)


@pytest.mark.parametrize(("behaviour", "mode", "evidence"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_gateway_is_dropped_and_a_good_one_finishes(
    origin: tuple[BlockStore, CID],
    tmp_path: Path,
    servers: ExitStack,
    behaviour: str,
    mode: str,
    evidence: str,
) -> None:
    src, root = origin
    bad = servers.enter_context(app_thread(_bad_app(src, behaviour)))
    good = servers.enter_context(gateway_thread(src))
    store = BlockStore(tmp_path / "joiner")
    report = fetch_via(store, root, [(bad, mode), (good.url, mode)])
    assert verify_checkpoint(store, root).ok
    assert evidence in report.dropped[f"gateway:{bad}"]
    _nothing_bad_stored(store)


def test_404_mid_transfer_switches_source_or_says_what_is_missing(
    origin: tuple[BlockStore, CID], tmp_path: Path, servers: ExitStack
) -> None:
    src, root = origin
    flaky = servers.enter_context(app_thread(_bad_app(src, "404-mid")))
    alone = BlockStore(tmp_path / "alone")
    with pytest.raises(FetchError, match="lacks them") as info:
        fetch_via(alone, root, [(flaky, "raw")])
    assert info.value.fetched == 3  # what it did serve is kept (a later fetch resumes)
    _nothing_bad_stored(alone)
    good = servers.enter_context(gateway_thread(src))
    report = fetch_via(alone, root, [(flaky, "raw"), (good.url, "raw")])
    assert verify_checkpoint(alone, root).ok and not report.dropped


def test_a_slow_gateways_work_moves_to_a_fast_one(
    origin: tuple[BlockStore, CID], tmp_path: Path, servers: ExitStack
) -> None:
    src, root = origin
    slow = servers.enter_context(app_thread(_bad_app(src, "slow")))
    fast = servers.enter_context(gateway_thread(src))
    store = BlockStore(tmp_path / "joiner")
    report = fetch_via(store, root, [(slow, "raw"), (fast.url, "raw")])
    assert verify_checkpoint(store, root).ok
    assert report.per_holder_bytes[f"gateway:{fast.url}"] > 0.8 * report.bytes
    assert report.seconds < 10  # the slow one alone: ~0.5 s x 30+ blocks / 2 workers


# -- a trickling gateway (issue 29): the right bytes, far under MIN_SOURCE_RATE ---------------


@pytest.fixture
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "SOURCE_RATE_WINDOW_S", 1.0)


@pytest.mark.usefixtures("short_window")
def test_a_trickling_gateway_alone_fails_naming_its_url(
    origin: tuple[BlockStore, CID], tmp_path: Path, servers: ExitStack
) -> None:
    src, root = origin
    url = servers.enter_context(app_thread(_bad_app(src, "trickle")))
    store = BlockStore(tmp_path / "joiner")
    start = time.monotonic()
    with pytest.raises(FetchError, match="could not be fetched") as info:
        fetch_via(store, root, [(url, "raw")])
    assert time.monotonic() - start < 15  # a window or so, not the trickle's hours
    assert f"'gateway:{url}': 'too slow:" in str(info.value)  # the whole URL
    _nothing_bad_stored(store)


@pytest.mark.usefixtures("short_window")
def test_a_trickling_gateway_beside_an_honest_one_is_dropped_and_the_fetch_done(
    origin: tuple[BlockStore, CID],
    tmp_path: Path,
    servers: ExitStack,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """End-game stealing off: only the rate rule moves the trickler's work (which includes the
    manifest root when it takes that first: the case issue 29 saw stall for 150 s)."""
    monkeypatch.setattr(limits, "STEAL_MIN_OBSERVED_S", 1e9)
    src, root = origin
    trickle = servers.enter_context(app_thread(_bad_app(src, "trickle")))
    honest = servers.enter_context(gateway_thread(src))
    alone = fetch_via(BlockStore(tmp_path / "alone"), root, [(honest.url, "raw")])
    store = BlockStore(tmp_path / "joiner")
    report = fetch_via(store, root, [(trickle, "raw"), (honest.url, "raw")])
    assert verify_checkpoint(store, root).ok
    assert "too slow" in report.dropped[f"gateway:{trickle}"]
    assert report.per_holder_bytes == {f"gateway:{honest.url}": report.bytes}
    # The honest one's own time, plus at most one window and a check interval (and slack
    # for a loaded machine).
    assert report.seconds < alone.seconds + 1.25 * limits.SOURCE_RATE_WINDOW_S + 5
