"""Benchmark: 1,000 lightweight peers join one coordinator and cycle through rounds on loopback.

The coordinator runs in its own process (``cnode coordinator serve``, SQLite with
``synchronous=FULL``); the peers are asyncio tasks of this process, each with its own key, signing
every request like a real node (``CoordinatorClient``), sharing one HTTP connection pool. Each peer
joins, then for every round: ``join_round``, ``ready``, waits for the member list (long poll;
see ``wait_listed`` for what a lightweight peer checks).

Prints: requests/s and p50/p99 latency per request kind; the baseline measured in the same run is
the unsigned ``GET /v1/health`` (no crypto, no SQLite), so the ratio shows what signing, checks
and durable writes cost. Then checks that no acknowledged state was lost: every acknowledged
``ready`` is in the change log, and every published member list is exactly the acknowledged
readies of that round.

    .venv/bin/python bench/coordinator.py [--peers 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
import psutil
import tomli_w

from cnode.auth import Identity, load_identity, save_identity
from cnode.node.coordinator import (
    AccessConfig,
    CoordinatorClient,
    CoordinatorRejected,
    RoundsConfig,
    RoundStatus,
    RunConfig,
    SyncCoordinatorClient,
)
from cnode.node.coordinator.server import CoordinatorProcess

RUN = "bench"
_TIMEOUT = httpx.Timeout(300.0)  # a starved machine can take minutes per round


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(name: str, latencies: list[float], elapsed: float) -> float:
    rate = len(latencies) / elapsed if elapsed > 0 else float("nan")
    print(
        f"  {name:<14} {len(latencies):>6} req  {rate:>8.0f} req/s  "
        f"p50 {1000 * statistics.median(latencies):7.1f} ms  "
        f"p99 {1000 * pct(latencies, 0.99):7.1f} ms"
    )
    return rate


async def baseline(url: str, n: int, workers: int) -> float:
    """``n`` unsigned GETs of /v1/health from ``workers`` clients, each with its own connection."""
    latencies: list[float] = []

    async def worker(count: int) -> None:
        async with httpx.AsyncClient(timeout=_TIMEOUT) as http:
            for _ in range(count):
                t = time.perf_counter()
                r = await http.get(f"{url}/v1/health")
                r.raise_for_status()
                latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(n // workers) for _ in range(workers)))
    return report("GET health", latencies, time.perf_counter() - t0)


async def wait_listed(http: httpx.AsyncClient, url: str, n: int) -> bytes:
    """A lightweight peer's wait: long polls until round ``n``'s signed record is published.

    It returns the envelope bytes without verifying them: one process simulating a thousand
    peers cannot verify a thousand copies of a 54 KB signed list per round (~65 ms each here);
    each round is verified in full once, and every peer checks its id is in the signed bytes.
    """
    while True:
        r = await http.get(f"{url}/v1/runs/{RUN}/rounds/{n}", params={"wait": "10"})
        r.raise_for_status()
        data = base64.b64decode(r.json()["envelope"], validate=True)
        if b"\x69published" in data:  # the CBOR text string "published" (status field)
            return data


async def swarm(
    proc: CoordinatorProcess, peers: list[Identity], rounds: int
) -> tuple[dict[str, list[float]], float, dict[int, set[str]]]:
    lat: dict[str, list[float]] = defaultdict(list)
    acked_ready: dict[int, set[str]] = defaultdict(set)
    dropped: list[str] = []
    verified: set[int] = set()
    # One HTTP client (and connection) per peer, as on real machines; httpx's pool scans its
    # connections on every request, so one pool of a thousand would measure httpx, not us.
    https = [httpx.AsyncClient(timeout=_TIMEOUT) for _ in peers]
    clients = [
        CoordinatorClient(proc.url, run=RUN, coordinator=proc.peer_id, identity=p, http=h)
        for p, h in zip(peers, https, strict=True)
    ]

    async def timed(kind: str, coro: object) -> object:
        t = time.perf_counter()
        result = await coro  # type: ignore[misc]
        lat[kind].append(time.perf_counter() - t)
        return result

    async def peer(c: CoordinatorClient, http: httpx.AsyncClient, me: str) -> None:
        await timed("join", c.join())
        for _ in range(rounds):
            n = await timed("join_round", c.join_round())
            try:
                await timed("ready", c.ready(n))  # type: ignore[arg-type]
            except CoordinatorRejected as exc:
                # Too slow (this process starved of CPU): dropped at the deadline, as the
                # protocol says. Not acknowledged, so not expected in the member list.
                dropped.append(exc.code)
                continue
            acked_ready[n].add(me)  # type: ignore[index]
            data = await timed("wait_members", wait_listed(http, proc.url, n))  # type: ignore[arg-type]
            if n not in verified:  # one full verification per round, as every node does its own
                verified.add(n)  # type: ignore[arg-type]
                info = await c.round_info(n)  # type: ignore[arg-type]
                assert info.status is RoundStatus.PUBLISHED
            assert me.encode() in data, f"{me} acknowledged ready for {n} but is not listed"  # type: ignore[operator]

    t0 = time.perf_counter()
    await asyncio.gather(
        *(peer(c, h, p.peer_id_str) for c, h, p in zip(clients, https, peers, strict=True))
    )
    elapsed = time.perf_counter() - t0
    for h in https:
        await h.aclose()
    if dropped:
        print(f"  {len(dropped)} readies came after their round's deadline ({set(dropped)})")
    return lat, elapsed, acked_ready


def check_no_lost_state(
    proc: CoordinatorProcess, key: Identity, acked_ready: dict[int, set[str]]
) -> None:
    with SyncCoordinatorClient(proc.url, run=RUN, coordinator=proc.peer_id, identity=key) as admin:
        entries: list[dict[str, object]] = []
        while True:
            page = admin.log(after=int(entries[-1]["seq"]) if entries else 0)  # type: ignore[call-overload]
            if not page:
                break
            entries += page
    logged_ready: dict[int, set[str]] = defaultdict(set)
    published: dict[int, set[str]] = {}
    for e in entries:
        detail = e["detail"]
        assert isinstance(detail, dict)
        if e["kind"] == "ready":
            logged_ready[int(detail["round"])].add(str(e["actor"]))
        if e["kind"] == "round_published":
            published[int(detail["round"])] = set(detail["members"])
    lost = sum(len(peers - logged_ready[n]) for n, peers in acked_ready.items())
    mismatched = [n for n, peers in acked_ready.items() if published.get(n) != peers]
    print(f"  change log: {len(entries)} entries; rounds published: {len(published)}")
    print(f"  acknowledged readies missing from the log: {lost}")
    print(f"  rounds whose published list differs from the acknowledged readies: {mismatched}")
    if lost or mismatched:
        raise SystemExit("LOST STATE")


async def run(args: argparse.Namespace, tmp: Path) -> None:
    key = Identity.generate()
    save_identity(key, tmp / "coordinator.key")
    peers = [Identity.generate() for _ in range(args.peers)]
    config = RunConfig(
        run=RUN,
        coordinator=key.peer_id_str,
        rounds=RoundsConfig(min_participants=2, round_timeout_s=args.round_timeout),
        access=AccessConfig(peers=[p.peer_id_str for p in peers]),
    )
    (tmp / "run.toml").write_text(tomli_w.dumps(config.to_dict()))
    with CoordinatorProcess(tmp / "run.toml", tmp / "state.db", tmp / "coordinator.key") as proc:
        print(f"coordinator {proc.url}; {args.peers} peers, {args.rounds} rounds")
        print("baseline (same run):")
        base = await baseline(proc.url, 5 * args.peers, min(args.peers, 200))
        server = psutil.Process(proc.proc.pid if proc.proc else 0)
        cpu0, mine0 = sum(server.cpu_times()[:2]), sum(psutil.Process().cpu_times()[:2])
        lat, elapsed, acked = await swarm(proc, peers, args.rounds)
        cpu = sum(server.cpu_times()[:2]) - cpu0
        mine = sum(psutil.Process().cpu_times()[:2]) - mine0
        total = sum(len(v) for v in lat.values())
        signed = sum(len(lat[k]) for k in ("join", "join_round", "ready"))
        print(f"swarm: {elapsed:.1f} s, {total} requests ({total / elapsed:.0f} req/s overall)")
        print(
            f"  CPU: coordinator {cpu:.1f} s ({1000 * cpu / total:.2f} ms/request), "
            f"peers (this process) {mine:.1f} s; machine load {os.getloadavg()[0]:.1f}"
        )
        for kind in ("join", "join_round", "ready", "wait_members"):
            report(kind, lat[kind], elapsed)
        signed_rate = signed / elapsed
        print(
            f"signed state-changing requests: {signed_rate:.0f} req/s = "
            f"{signed_rate / base:.3f} x the health baseline ({base:.0f} req/s)"
        )
        all_signed = lat["join"] + lat["join_round"] + lat["ready"]
        print(f"signed request p99 latency: {1000 * pct(all_signed, 0.99):.1f} ms")
        print("no lost state:")
        check_no_lost_state(proc, load_identity(tmp / "coordinator.key"), acked)
        db = tmp / "state.db"
        print(f"  database: {db.stat().st_size / 1e6:.1f} MB (+ WAL)")
        print(
            json.dumps(
                {
                    "peers": args.peers,
                    "rounds": args.rounds,
                    "signed_req_per_s": round(signed_rate),
                    "health_req_per_s": round(base),
                    "signed_p99_ms": round(1000 * pct(all_signed, 0.99), 1),
                }
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-timeout", type=float, default=300.0, help="seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cnode-bench-coord-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
