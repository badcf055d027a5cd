"""CPU of the block exchange per small block and per partition fetch (issue 41, 16 members).

Run: ``python bench/block_hops.py`` (``--only hops|blocks|segments|parse|streams``). Prints
figures and their ratios to a baseline measured in the same run; only part 5 asserts (that each
way opened the streams it claims to).

1. ``hops``: what one block costs hashed (``verify_received``), stored in a batch
   (``put_verified``) and read back verified (``BlockStore.get``) on the event loop's thread
   against through ``trio.to_thread`` (the hop), by block size: where INLINE_BLOCK_BYTES sits.
2. ``blocks``: 1,000 small blocks fetched between two real nodes in one process
   (``P2PNode.fetch_blocks``): CPU per block of both sides, with INLINE_BLOCK_BYTES as the node
   ships it against 0 (every block hashed, stored and read in a worker thread: the code before
   it), runs alternated.
3. ``segments``: ``fetch_update_segments`` of 4 of the 64 segments of sparse-sized updates
   (segments of 0.4-2 KB, as a 16-member round's are) between two real nodes in one process:
   CPU ms per update, both sides. Baseline in the same run: the fetch as it was before (walk
   the whole manifest with ``missing_blocks`` before each level, one ``fetch_blocks`` per
   level, then ``read_manifest`` for the wanted chunks), on the same decoder. Updates are made
   in a child process: this one parses each for the first time, as a member's node does.
4. ``parse``: one such update root read the first time (``read_manifest``: the decoder and the
   schema checks) against the decoding it replaced (``dag_cbor.decode``, its re-encode, links
   to CIDs through ``multiformats``), same bytes, same run.
5. ``streams``: N sequential one-block fetches (``P2PNode.fetch_blocks``) from one holder
   between two real nodes in one process: CPU ms per request, both sides, with the node's
   pool of idle streams (each request after the first takes the last one's stream) against
   a pool that keeps nothing (every request opens, negotiates and closes its own stream: the
   code before it), runs alternated.
6. ``answers``: the requests a 32-member round makes most, between two real nodes in one
   process, with the holder answering each in one write when it fits COALESCED_ANSWER_BYTES
   (as the node ships) against 0 (a write per frame: a BLOCK each, then END: the code before
   it), runs alternated: ``fetch_update_segments`` of 2 of 64 segments of fresh updates (CPU ms
   per update, both sides: two requests, the root and its chunks) and sequential one-block
   ``fetch_blocks`` of 6.5 KB (a partition result's size at 32 members; CPU ms per request).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import trio

from cnode.auth import Identity
from cnode.node.p2p import P2PNode, P2PSettings, limits, open_p2p_node
from cnode.node.train import fetch_update_segments, store_update
from cnode.storage import (
    CID,
    DAG_CBOR,
    BlockStore,
    VerifiedBlock,
    compute_cid,
    missing_blocks,
    read_manifest,
    verify_received,
)

LOOPBACK = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))


def _make_updates(root: str, count: int, seed: int) -> list[str]:
    """``count`` sparse-sized updates stored in the store at ``root``, made in a child process
    so that this process has parsed none of them (its manifest memo would hide first parses)."""
    store = BlockStore(Path(root))
    out = []
    for u in range(count):
        gen = torch.Generator().manual_seed(seed * 1000 + u)
        encoded = [
            torch.randint(0, 255, (400 + (i * 97 + u) % 1600,), dtype=torch.uint8, generator=gen)
            for i in range(64)
        ]
        base = CID(0x55, seed.to_bytes(32, "big"))
        out.append(str(store_update(store, encoded, run="bench", round_=1, base=base)))
    return out


def _updates(store: BlockStore, count: int, seed: int) -> list[CID]:
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        made = pool.submit(_make_updates, str(store.root), count, seed).result()
    return [CID.parse(c) for c in made]


# -- 1. hops --------------------------------------------------------------------------------


async def _per_block(n: int, step: Callable[[], Awaitable[object]]) -> float:
    start = time.process_time()
    for _ in range(n):
        await step()
    return (time.process_time() - start) / n * 1e6


async def _hops(tmp: Path) -> None:
    store = BlockStore(tmp / "hops")
    print("size | hash inline / hop us | put inline / hop us | get inline / hop us (CPU/block)")
    for size in (512, 4096, 16384, 65536, 262144, 1 << 20):
        n = 300 if size <= 65536 else 40
        blocks = [os.urandom(size) for _ in range(n)]
        cids = [compute_cid(b) for b in blocks]
        it = iter(range(10**9))
        figures = []

        async def inline(fn: Callable[[int], object], it: Iterator[int] = it, n: int = n) -> None:
            fn(next(it) % n)
            await trio.lowlevel.checkpoint()

        async def hop(fn: Callable[[int], object], it: Iterator[int] = it, n: int = n) -> None:
            await trio.to_thread.run_sync(fn, next(it) % n)

        verified = [verify_received(c, b) for c, b in zip(cids, blocks, strict=True)]
        batch = store.begin_unsynced()

        def put(i: int, cids: list[CID] = cids, verified: list[VerifiedBlock] = verified) -> None:
            store.delete(cids[i])
            store.put_verified(verified[i], batch=batch)  # noqa: B023 (used in this iteration)

        def check(i: int, cids: list[CID] = cids, blocks: list[bytes] = blocks) -> object:
            return verify_received(cids[i], blocks[i])

        def get(i: int, cids: list[CID] = cids) -> object:
            return store.get(cids[i])

        steps: Sequence[Callable[[int], object]] = (check, put, get)
        for fn in steps:
            a = await _per_block(n, lambda fn=fn: inline(fn))  # type: ignore[misc]
            b = await _per_block(n, lambda fn=fn: hop(fn))  # type: ignore[misc]
            figures.append(f"{a:.0f} / {b:.0f}")
        batch.commit()
        print(f"{size} | " + " | ".join(figures))


# -- 2. blocks ------------------------------------------------------------------------------


async def _pair(
    tmp: Path, name: str, holder: BlockStore, work: Callable[[P2PNode, str], Awaitable[None]]
) -> None:
    b_id = Identity.generate()
    store = BlockStore(tmp / name)
    async with (
        open_p2p_node(b_id, holder, LOOPBACK, allow=bool) as b,
        open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as a,
    ):
        await a.connect(b.listen_addrs[0])
        await work(a, b_id.peer_id_str)


async def _blocks(tmp: Path, runs: int) -> None:
    holder = BlockStore(tmp / "holder-blocks")
    sizes = [300 + (i * 37) % 3000 for i in range(1000)]  # 0.3-3.3 KB: a sparse round's
    shipped = limits.INLINE_BLOCK_BYTES
    per: dict[int, list[float]] = {shipped: [], 0: []}
    for run in range(runs):
        for inline in (shipped, 0):
            cids = [holder.put_new(os.urandom(s)) for s in sizes]
            limits.INLINE_BLOCK_BYTES = inline
            spent: list[float] = []

            async def work(
                a: P2PNode, holder_id: str, cids: list[CID] = cids, spent: list[float] = spent
            ) -> None:
                start = time.process_time()
                await a.fetch_blocks(cids, [holder_id])
                spent.append(time.process_time() - start)

            await _pair(tmp, f"blocks-{run}-{inline}", holder, work)
            per[inline].append(spent[0] / len(sizes) * 1e6)
    limits.INLINE_BLOCK_BYTES = shipped
    new, old = statistics.median(per[shipped]), statistics.median(per[0])
    print(
        f"1,000 blocks of 0.3-3.3 KB, both sides' CPU per block (median of {runs}): "
        f"INLINE_BLOCK_BYTES={shipped}: {new:.0f} us; every block in a thread (before): "
        f"{old:.0f} us; ratio {new / old:.2f}"
    )


# -- 3. segments ----------------------------------------------------------------------------


async def _old_fetch_update_segments(
    node: P2PNode, update: CID, indices: Sequence[int], holders: Sequence[str]
) -> int:
    """The fetch as it was before this bench's commit (the baseline): a whole-manifest walk
    before each level, one fetch per level, then the manifest read for the wanted chunks."""
    store = node.store
    fetched = 0

    def missing_nodes() -> list[CID]:
        if not store.has(update):
            return [update]
        return [c for c in missing_blocks(store, update) if c.codec == DAG_CBOR]

    def wanted_chunks() -> list[CID]:
        manifest = read_manifest(store, update)
        names = {manifest.layers[i].name for i in indices}  # segment.NNN, in order
        chunks = [c for layer in manifest.layers if layer.name in names for c in layer.chunks]
        return [c for c in chunks if not store.has(c)]

    for _ in range(4):
        nodes = await trio.to_thread.run_sync(missing_nodes)
        if not nodes:
            break
        fetched += (await node.fetch_blocks(nodes, holders=holders)).bytes
    wanted = await trio.to_thread.run_sync(wanted_chunks)
    if wanted:
        fetched += (await node.fetch_blocks(wanted, holders=holders)).bytes
    return fetched


async def _segments(tmp: Path, made: dict[tuple[int, str], list[CID]], runs: int) -> None:
    holder = BlockStore(tmp / "holder-segments")
    ways = {"fetch_update_segments": fetch_update_segments, "before": _old_fetch_update_segments}
    per: dict[str, list[float]] = {k: [] for k in ways}
    count = len(made[0, "before"])
    for run in range(runs):
        for name, fetch in ways.items():
            updates = made[run, name]  # new bytes every time: first parses
            spent: list[float] = []

            async def work(
                a: P2PNode,
                holder_id: str,
                updates: list[CID] = updates,
                spent: list[float] = spent,
                fetch: Callable[..., Awaitable[int]] = fetch,
            ) -> None:
                start = time.process_time()
                for i, update in enumerate(updates):
                    await fetch(a, update, [(4 * i + k) % 64 for k in range(4)], [holder_id])
                spent.append(time.process_time() - start)

            await _pair(tmp, f"seg-{run}-{name}", holder, work)
            per[name].append(spent[0] / count * 1e3)
    new, old = (statistics.median(per[k]) for k in ways)
    print(
        f"fetch_update_segments, 4 of 64 segments, {count} updates, both sides' CPU per update "
        f"(median of {runs}): {new:.1f} ms; the fetch before (same decoder): {old:.1f} ms; "
        f"ratio {new / old:.2f}"
    )


# -- 5. streams ----------------------------------------------------------------------------


async def _streams(tmp: Path, runs: int, requests: int) -> None:
    holder = BlockStore(tmp / "holder-streams")
    per: dict[str, list[float]] = {"pooled": [], "fresh": []}
    for run in range(runs):
        for way in per:
            cids = [holder.put_new(os.urandom(800)) for _ in range(requests)]
            spent: list[float] = []

            async def work(
                a: P2PNode,
                holder_id: str,
                cids: list[CID] = cids,
                spent: list[float] = spent,
                way: str = way,
            ) -> None:
                if way == "fresh":  # the baseline: a pool that keeps nothing, so every
                    # request's stream is closed after its END, as before the pool
                    a.pool.give = lambda _holder, _stream: False  # type: ignore[method-assign]
                start = time.process_time()
                for cid in cids:
                    await a.fetch_blocks([cid], [holder_id])
                spent.append(time.process_time() - start)
                assert a.pool.opened == (1 if way == "pooled" else len(cids)), a.pool.opened

            await _pair(tmp, f"streams-{run}-{way}", holder, work)
            per[way].append(spent[0] / requests * 1e3)
    new, old = (statistics.median(per[k]) for k in ("pooled", "fresh"))
    print(
        f"{requests} sequential one-block requests to one holder, both sides' CPU per request "
        f"(median of {runs}): pooled stream {new:.2f} ms; fresh stream each (before) "
        f"{old:.2f} ms; ratio {new / old:.2f}"
    )


# -- 6. answers -----------------------------------------------------------------------------


async def _answers(
    tmp: Path, made: dict[tuple[int, int], list[CID]], runs: int, requests: int
) -> None:
    holder = BlockStore(tmp / "holder-answers")
    shipped = limits.COALESCED_ANSWER_BYTES
    per: dict[tuple[str, int], list[float]] = {
        (k, c): [] for k in ("seg", "one") for c in (shipped, 0)
    }
    for run in range(runs):
        for coalesce in (shipped, 0):
            updates = made[run, coalesce]  # new bytes every time: first parses
            results = [holder.put_new(os.urandom(6500)) for _ in range(requests)]
            limits.COALESCED_ANSWER_BYTES = coalesce
            spent: dict[str, float] = {}

            async def work(
                a: P2PNode,
                holder_id: str,
                updates: list[CID] = updates,
                results: list[CID] = results,
                spent: dict[str, float] = spent,
            ) -> None:
                start = time.process_time()
                for i, update in enumerate(updates):
                    await fetch_update_segments(
                        a, update, [(2 * i) % 64, (2 * i + 1) % 64], [holder_id]
                    )
                spent["seg"] = (time.process_time() - start) / len(updates)
                start = time.process_time()
                for cid in results:
                    await a.fetch_blocks([cid], [holder_id])
                spent["one"] = (time.process_time() - start) / len(results)

            await _pair(tmp, f"answers-{run}-{coalesce}", holder, work)
            for kind in ("seg", "one"):
                per[kind, coalesce].append(spent[kind] * 1e3)
    limits.COALESCED_ANSWER_BYTES = shipped
    for kind, what in (("seg", "fetch_update_segments, 2 of 64 segments, per update"),
                       ("one", "one-block fetch_blocks of 6.5 KB, per request")):  # fmt: skip
        new, old = statistics.median(per[kind, shipped]), statistics.median(per[kind, 0])
        print(
            f"{what}, both sides' CPU (median of {runs}): answered at once "
            f"(COALESCED_ANSWER_BYTES={shipped}) {new:.2f} ms; a write per frame (before) "
            f"{old:.2f} ms; ratio {new / old:.2f}"
        )


# -- 4. parse -------------------------------------------------------------------------------


def _parse(tmp: Path) -> None:
    import dag_cbor

    store = BlockStore(tmp / "parse")
    updates = _updates(store, 10, 99)
    roots = [store.get(u) for u in updates]

    def replaced(data: bytes) -> object:
        value = dag_cbor.decode(data)
        assert dag_cbor.encode(value) == data
        links = [value["layers"][i]["chunks"][0] for i in range(64)]
        return [CID.parse(bytes(link)) for link in links]  # as storage/_cbor.py did

    start = time.process_time()
    for cid in updates:
        read_manifest(store, cid)  # the node's own read: parse_root, first time for these bytes
    new = (time.process_time() - start) / len(updates) * 1e3
    start = time.process_time()
    for data in roots:
        replaced(data)
    old = (time.process_time() - start) / len(roots) * 1e3
    print(
        f"one 64-segment update root ({len(roots[0])} bytes), first read: read_manifest "
        f"{new:.1f} ms; dag_cbor decode + re-encode + links (the decoding it replaced, without "
        f"the schema checks) {old:.1f} ms; ratio {new / old:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=["hops", "blocks", "segments", "parse", "streams", "answers"]
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--updates", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.only in (None, "hops"):
            trio.run(_hops, tmp)
        if args.only in (None, "blocks"):
            trio.run(_blocks, tmp, args.runs)
        if args.only in (None, "segments"):
            holder = BlockStore(tmp / "holder-segments")
            made = {
                (run, way): _updates(holder, args.updates, 1 + 2 * run + (way == "before"))
                for run in range(args.runs)
                for way in ("fetch_update_segments", "before")
            }
            trio.run(_segments, tmp, made, args.runs)
        if args.only in (None, "parse"):
            _parse(tmp)
        if args.only in (None, "streams"):
            trio.run(_streams, tmp, args.runs, args.requests)
        if args.only in (None, "answers"):
            holder = BlockStore(tmp / "holder-answers")
            shipped = limits.COALESCED_ANSWER_BYTES
            fresh = {
                (run, way): _updates(holder, 4 * args.updates, 100 + 2 * run + (way == 0))
                for run in range(args.runs)
                for way in (shipped, 0)
            }
            trio.run(_answers, tmp, fresh, args.runs, args.requests)


if __name__ == "__main__":
    main()
