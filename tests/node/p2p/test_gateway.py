"""node/p2p/_gateway.py: a cnode holder's trustless gateway, spoken to over real HTTP.

Each case is written from the trustless gateway spec's text (specs/gateway.md cites it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from cnode.storage import (
    CID,
    BlockStore,
    CheckpointMeta,
    compute_cid,
    manifest_closure,
    read_car,
    read_manifest,
    save_checkpoint,
    unixfs_view,
)
from tests.support.http import gateway_thread

RAW = "application/vnd.ipld.raw"
CAR = "application/vnd.ipld.car"
CACHE = "public, max-age=29030400, immutable"


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> tuple[BlockStore, CID]:
    store = BlockStore(tmp_path_factory.mktemp("gw") / "blocks")
    w = torch.randn(400_000)
    state = {"wte.weight": w, "lm_head.weight": w, "ln.b": torch.ones(5)}  # tied: shared chunks
    meta = CheckpointMeta(
        run_id="gw", model_config={"model_type": "gpt2"}, tokenizer_files={"vocab.json": b"{}"}
    )
    return store, save_checkpoint(store, state, meta)


@pytest.fixture(scope="module")
def gw(held: tuple[BlockStore, CID]) -> Iterator[httpx.Client]:
    store, _ = held
    with gateway_thread(store) as gateway, httpx.Client(base_url=gateway.url, timeout=10) as c:
        yield c


def _car(response: httpx.Response) -> tuple[list[CID], list[tuple[CID, bytes]]]:
    assert response.status_code == 200, response.text
    roots, sections = read_car(response.content, max_sections=10_000)
    for cid, data in sections:
        assert compute_cid(data, cid.codec) == cid
    return roots, sections


def test_raw_block_with_the_specs_headers(gw: httpx.Client, held: tuple[BlockStore, CID]) -> None:
    store, root = held
    r = gw.get(f"/ipfs/{root}", headers={"Accept": RAW})
    assert r.status_code == 200 and r.content == store.get(root)
    h = r.headers
    assert h["content-type"] == RAW and h["content-length"] == str(len(r.content))
    assert h["x-content-type-options"] == "nosniff" and h["cache-control"] == CACHE
    assert h["etag"] == f'"{root}.raw"' and h["x-ipfs-path"] == f"/ipfs/{root}"
    assert h["vary"] == "Accept" and h["content-disposition"].startswith("attachment")
    head = gw.head(f"/ipfs/{root}?format=raw")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(r.content))
    again = gw.get(f"/ipfs/{root}?format=raw", headers={"If-None-Match": h["etag"]})
    assert again.status_code == 304


Held = tuple[BlockStore, CID]


def test_format_query_takes_precedence_over_accept(gw: httpx.Client, held: Held) -> None:
    _, root = held
    r = gw.get(f"/ipfs/{root}?format=raw", headers={"Accept": CAR})
    assert r.headers["content-type"] == RAW


def test_car_all_of_a_manifest_is_its_checkpoint(gw: httpx.Client, held: Held) -> None:
    store, root = held
    r = gw.get(f"/ipfs/{root}", headers={"Accept": f"{CAR}; version=1; order=dfs; dups=n"})
    assert r.headers["content-type"] == f"{CAR}; version=1; order=dfs; dups=n"
    assert r.headers["etag"] == f'"{root}.car.all.dfs.n"'
    roots, sections = _car(r)
    assert roots == [root] and sections[0][0] == root
    cids = [cid for cid, _ in sections]
    assert len(cids) == len(set(cids))  # dups=n
    assert set(cids) == set(manifest_closure(store, root))


def test_car_dups_y_repeats_shared_chunks(gw: httpx.Client, held: tuple[BlockStore, CID]) -> None:
    store, root = held
    view = unixfs_view(store, root)
    weights = view.files["model.safetensors"]
    r = gw.get(f"/ipfs/{weights}?format=car&car-dups=y")
    assert r.headers["content-type"].endswith("dups=y")
    _, sections = _car(r)
    chunks = read_manifest(store, root).layer("wte.weight").chunks
    assert [c for c, _ in sections].count(chunks[0]) == 2  # tied weights: once per tensor


def test_dag_scopes(gw: httpx.Client, held: tuple[BlockStore, CID]) -> None:
    store, root = held
    view = unixfs_view(store, root)
    block = _car(gw.get(f"/ipfs/{view.root}?format=car&dag-scope=block"))[1]
    assert [c for c, _ in block] == [view.root]
    directory = _car(gw.get(f"/ipfs/{view.root}?format=car&dag-scope=entity"))[1]
    assert [c for c, _ in directory] == [view.root]  # enumerating a directory needs its node
    weights = view.files["model.safetensors"]
    entity = _car(gw.get(f"/ipfs/{weights}?format=car&dag-scope=entity"))[1]
    everything = _car(gw.get(f"/ipfs/{weights}?format=car&dag-scope=all"))[1]
    assert entity == everything and len(entity) > 2
    whole = _car(gw.get(f"/ipfs/{view.root}?format=car"))[1]
    assert {c for c, _ in whole} >= {c for c, _ in everything} | set(view.files.values())


def test_probe_path(gw: httpx.Client) -> None:
    r = gw.get("/ipfs/bafkqaaa?format=raw")
    assert r.status_code == 200 and r.content == b""
    r = gw.get("/ipfs/bafkqaaa", headers={"Accept": CAR})
    assert r.status_code == 200 and r.content.endswith(b"version\x01")


@pytest.mark.parametrize(
    ("url", "accept", "status", "text"),
    [
        ("/ipfs/not-a-cid?format=raw", None, 400, "bad CID"),
        ("/ipfs/QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG?format=raw", None, 400, "CIDv0"),
        (f"/ipfs/{compute_cid(b'absent')}?format=raw", None, 404, "not held"),
        (f"/ipfs/{compute_cid(b'absent')}?format=car", None, 404, "not held"),
        ("/ipfs/ROOT/config.json?format=raw", None, 400, "takes no path"),
        ("/ipfs/ROOT/config.json?format=car", None, 501, "paths are not supported"),
        ("/ipfs/ROOT?format=tar", None, 400, "format=tar"),
        ("/ipfs/ROOT", None, 400, "ask for a block"),
        ("/ipfs/ROOT", "text/html", 406, "not acceptable"),
        ("/ipfs/ROOT", f"{CAR}; version=2", 406, "version 2"),
        ("/ipfs/ROOT", f"{CAR}; order=weird", 406, "order=weird"),
        ("/ipfs/ROOT?format=car&dag-scope=deep", None, 400, "dag-scope=deep"),
        ("/ipfs/ROOT?format=car&entity-bytes=0:10", None, 400, "entity-bytes"),
        ("/ipfs/ROOT?format=car&car-dups=maybe", None, 400, "dups=maybe"),
    ],
)
def test_bad_requests_get_the_specs_status_and_a_reason(
    gw: httpx.Client,
    held: tuple[BlockStore, CID],
    url: str,
    accept: str | None,
    status: int,
    text: str,
) -> None:
    _, root = held
    headers = {"Accept": accept} if accept else {"Accept": ""}
    r = gw.get(url.replace("ROOT", str(root)), headers=headers)
    assert r.status_code == status and text in r.text, r.text
    assert r.headers["x-content-type-options"] == "nosniff"


def test_uploads_go_through_the_rate_cap(held: tuple[BlockStore, CID], tmp_path: Path) -> None:
    store, root = held
    taken: list[int] = []

    async def take(amount: int) -> None:
        taken.append(amount)
        await asyncio.sleep(0)

    chunk = read_manifest(store, root).layers[0].chunks[0]
    with gateway_thread(store, take) as gateway:
        r = httpx.get(f"{gateway.url}/ipfs/{chunk}?format=raw", timeout=10)
        car = httpx.get(f"{gateway.url}/ipfs/{root}?format=car", timeout=10)
    assert r.status_code == car.status_code == 200
    assert sum(taken) == len(r.content) + len(car.content)
    assert max(taken) <= 64 * 1024  # sent in pieces, so other streams share the cap fairly


def test_gateway_beside_trio_takes_from_the_nodes_bucket(held: Held) -> None:
    """``cnode train``'s way: aiohttp in its own thread, uploads through a trio TokenBucket."""
    import trio

    from cnode.node.p2p import TokenBucket, gateway_beside_trio

    store, root = held
    chunk = read_manifest(store, root).layers[0].chunks[0]  # 1 MiB

    async def main() -> tuple[int, float]:
        bucket = TokenBucket(2_000_000)  # 2 MB/s, a burst of 200 kB
        with trio.fail_after(30):
            async with (
                gateway_beside_trio(store, "127.0.0.1", 0, bucket) as url,
                httpx.AsyncClient(timeout=None) as client,
            ):
                began = trio.current_time()
                r = await client.get(f"{url}/ipfs/{chunk}?format=raw")
                return len(r.content), trio.current_time() - began

    size, seconds = trio.run(main)
    assert size == 1 << 20
    assert seconds >= (size - 200_000) / 2_000_000 * 0.85  # ~0.42 s: the cap held


def test_a_client_leaving_mid_car_leaves_the_gateway_serving(held: Held) -> None:
    import socket

    store, root = held
    with gateway_thread(store) as gateway:
        host, port = gateway.url.removeprefix("http://").split(":")
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(f"GET /ipfs/{root}?format=car HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                assert sock.recv(100).startswith(b"HTTP/1.1 200")
        r = httpx.get(f"{gateway.url}/ipfs/{root}?format=raw", timeout=10)
        assert r.status_code == 200 and r.content == store.get(root)
