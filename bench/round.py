"""Seconds per training round, split train / publish / fetch / aggregate, vs a plain all-reduce.

Four peers, each its own process, on loopback; a GPT-2-style model of ~10.2M parameters (so each
update is ~41 MB of float32). Per round, each cnode peer:

* train      one local AdamW step (batch 4 x 64 tokens) and the parameter delta;
* publish    store the delta as blocks (kind "update" manifest), sign the update header, put it
             on gossipsub;
* wait       until the other three headers have arrived (the slowest peer's training), and
             after fetching until every peer has fetched (so no peer serves blocks while it
             aggregates); reported apart, it is not this peer's work;
* fetch      the other three updates over the block exchange (/cnode/blocks/1.0.0), every
             block verified against its CID;
* aggregate  load the four updates, CenteredClip (default config), apply, state CID.

Each codec given with ``--codec`` (the run's ``update_codec``: f32, bf16, int8-blockwise; default
f32 and int8-blockwise) runs its own swarm; the report gives each one's phases and the update
bytes on the wire (one peer's update manifest, every block; and the bytes each peer fetched),
int8-blockwise against f32.

The baseline runs in the same invocation, the same way: four processes with torch.distributed
(gloo, loopback), the same model and step, then ``all_reduce(delta) / 4`` and apply.
Printed: the median over rounds (and peers) of each phase, and fetch+aggregate vs the
all-reduce. No coordinator is involved (it adds two small HTTP requests per round).

    .venv/bin/python bench/round.py              # 3 rounds
    .venv/bin/python bench/round.py --rounds 5
    .venv/bin/python bench/round.py --codec int8-blockwise --no-baseline
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PEERS = 4
# n_layer=6, n_embd=368 (4 heads), vocab 1024, 64 positions: 10,152,000 parameters (+ LayerNorms).
TRAINING = {
    "model": {"n_layer": 6, "n_embd": 368, "n_head": 4, "n_positions": 64},
    "local_steps": 1,
    "batch_size": 4,
    "data": {"eval_sequences": 8},
}


def _quiet() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# -- cnode peers -------------------------------------------------------------------------------


def _cnode_peer(index: int, work: str, rounds: int, out: str, codec: str) -> None:
    import torch

    torch.set_num_threads(1)
    _quiet()
    import trio

    trio.run(_cnode_peer_async, index, Path(work), rounds, Path(out), codec)


async def _cnode_peer_async(index: int, work: Path, rounds: int, out: Path, codec: str) -> None:
    import trio

    from cnode.auth import Identity
    from cnode.node.p2p import P2PSettings, open_p2p_node
    from cnode.node.train import (
        HeaderCollector,
        NodeTrainer,
        TrainingConfig,
        header_cid,
        updates_topic,
    )
    from cnode.storage import BlockStore, manifest_closure

    identity = Identity.generate()
    store = BlockStore(work / f"peer{index}")
    config = TrainingConfig.from_dict({**TRAINING, "update_codec": codec})
    trainer = await trio.to_thread.run_sync(
        lambda: NodeTrainer(config, run="bench", identity=identity, store=store)
    )
    headers = HeaderCollector("bench", lambda _peer: True)
    settings = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",), run_id="bench")
    timings: list[dict[str, Any]] = []
    async with open_p2p_node(identity, store, settings, allow=lambda _p: True) as node:
        (work / f"addr{index}").write_text(node.listen_addrs[0])
        addrs = await _wait_files(work, "addr", PEERS)
        for i, addr in enumerate(addrs):
            if i != index:
                await node.connect(addr)

        async with trio.open_nursery() as nursery:

            async def drain() -> None:
                async with node.subscribe(updates_topic("bench"), headers) as sub:
                    async for _ in sub:
                        pass

            nursery.start_soon(drain)
            await trio.sleep(3)  # let the gossip mesh form (heartbeat 1 s)
            for round_ in range(1, rounds + 1):
                t0 = time.perf_counter()
                own = await trio.to_thread.run_sync(trainer.train, round_)
                t_train = own.local.seconds
                t1 = time.perf_counter()
                headers.seen[(round_, trainer.peer)] = (own.envelope, own.header)
                await node.publish(updates_topic("bench"), own.envelope)
                t_publish = time.perf_counter() - t1 + own.seconds_store
                t2 = time.perf_counter()
                while sum(1 for (r, _p) in headers.seen if r == round_) < PEERS:
                    await trio.sleep(0.005)
                t_wait = time.perf_counter() - t2
                t3 = time.perf_counter()
                c3 = time.process_time()
                mine = {}
                for (r, peer), (envelope, header) in list(headers.seen.items()):
                    if r == round_:
                        cid = header_cid(envelope)
                        if not store.has(cid):
                            store.put(cid, envelope)
                        mine[peer] = (cid, header)
                fetched: list[int] = []

                async def fetch(update: Any, peer: str, into: list[int] = fetched) -> None:
                    into.append((await node.fetch(update, holders=[peer])).bytes)

                async with trio.open_nursery() as fetches:
                    for peer, (_cid, header) in mine.items():
                        if peer != trainer.peer:
                            fetches.start_soon(fetch, header.update, peer)
                update_bytes = sum(
                    store.size(c) for c in manifest_closure(store, own.header.update)
                )
                t_fetch = time.perf_counter() - t3
                cpu_fetch = time.process_time() - c3
                # Wait until every peer has fetched, so no peer serves blocks (GIL-bound, in the
                # main thread) while it aggregates: each phase is then timed on its own.
                t5 = time.perf_counter()
                (work / f"fetched{index}.{round_}").write_text("")
                await _wait_files(work, "fetched", PEERS, suffix=f".{round_}")
                t_wait += time.perf_counter() - t5
                t4 = time.perf_counter()
                c4 = time.process_time()
                await trio.to_thread.run_sync(trainer.aggregate, round_, mine, {})
                t_aggregate = time.perf_counter() - t4
                cpu_aggregate = time.process_time() - c4
                timings.append(
                    {
                        "train": t_train,
                        "publish": t_publish,
                        "wait": t_wait,
                        "fetch": t_fetch,
                        "aggregate": t_aggregate,
                        "fetch_cpu": cpu_fetch,
                        "aggregate_cpu": cpu_aggregate,
                        "round": time.perf_counter() - t0,
                        "state": str(trainer.state_cid),
                        "update_bytes": update_bytes,
                        "fetched_bytes": sum(fetched),
                    }
                )
                (work / f"done{index}.{round_}").write_text("")
                await _wait_files(work, "done", PEERS, suffix=f".{round_}")
            nursery.cancel_scope.cancel()
    out.write_text(json.dumps(timings))


async def _wait_files(work: Path, prefix: str, n: int, suffix: str = "") -> list[str]:
    import trio

    with trio.fail_after(120):
        while True:
            paths = [work / f"{prefix}{i}{suffix}" for i in range(n)]
            if all(p.exists() for p in paths):
                return [p.read_text() for p in paths]
            await trio.sleep(0.05)


# -- all-reduce baseline -----------------------------------------------------------------------


def _allreduce_peer(index: int, init: str, rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _quiet()
    from cnode.node.train import TextData, TrainingConfig, build_model, model_state, train_local

    dist.init_process_group("gloo", init_method=init, rank=index, world_size=PEERS)
    config = TrainingConfig.from_dict(TRAINING)
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    state = model_state(model)
    timings = []
    for round_ in range(1, rounds + 1):
        dist.barrier()
        t0 = time.perf_counter()
        local = train_local(model, state, data, config, peer_id=f"peer{index}", round_=round_)
        t1 = time.perf_counter()
        dist.barrier()  # the same "wait for the slowest trainer" as the cnode peers
        t_wait = time.perf_counter() - t1
        t2 = time.perf_counter()
        flat = torch.cat([local.delta[k].reshape(-1) for k in state])
        dist.all_reduce(flat)
        flat /= PEERS
        offset = 0
        for k in state:
            n = state[k].numel()
            state[k] = state[k] + flat[offset : offset + n].view_as(state[k])
            offset += n
        t_allreduce = time.perf_counter() - t2
        timings.append({"train": t1 - t0, "wait": t_wait, "allreduce": t_allreduce, "round": 0.0})
        timings[-1]["round"] = time.perf_counter() - t0
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(timings))


# -- driver ------------------------------------------------------------------------------------


def _run(target: Any, args_of: Any) -> list[list[dict[str, Any]]]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="cnode-bench-round-") as tmp:
        outs = [str(Path(tmp) / f"out{i}.json") for i in range(PEERS)]
        procs = [ctx.Process(target=target, args=args_of(i, tmp, outs[i])) for i in range(PEERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=900)
            if p.exitcode != 0:
                for q in procs:
                    q.kill()
                raise SystemExit(f"a peer process failed (exit {p.exitcode})")
        return [json.loads(Path(o).read_text()) for o in outs]


def _median(results: list[list[dict[str, Any]]], key: str, skip_first: bool) -> float:
    values = [r[key] for peer in results for r in peer[1 if skip_first else 0 :]]
    return statistics.median(values)


def _report_cnode(codec: str, cnode: list[list[dict[str, Any]]], skip: bool) -> dict[str, float]:
    rows = {
        k: _median(cnode, k, skip)
        for k in ("train", "publish", "wait", "fetch", "aggregate", "round")
    }
    cpu = {k: _median(cnode, f"{k}_cpu", skip) for k in ("fetch", "aggregate")}
    states = {r["state"] for peer in cnode for r in peer[-1:]}
    print(
        f"\ncnode round, update_codec = {codec!r} (median over peers and rounds"
        f"{', first round left out' if skip else ''}), seconds:"
    )
    for key, value in rows.items():
        extra = f"   (CPU {cpu[key]:.3f} s of this process)" if key in cpu else ""
        print(f"  {key:<10} {value:8.3f}{extra}")
    rows["update_bytes"] = _median(cnode, "update_bytes", False)
    rows["fetched_bytes"] = _median(cnode, "fetched_bytes", False)
    print(
        f"  update on the wire: {rows['update_bytes'] / 1e6:.2f} MB per peer "
        f"(all its blocks); each peer fetched {rows['fetched_bytes'] / 1e6:.2f} MB per round"
    )
    print(f"  honest peers agree on the final state: {len(states) == 1} ({len(states)} distinct)")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return rows


def main() -> None:
    from cnode.aggregation import CODECS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--codec",
        nargs="+",
        choices=CODECS,
        default=["f32", "int8-blockwise"],
        help="the run's update_codec; several: one swarm each, compared",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the gloo all-reduce")
    args = parser.parse_args()
    from cnode.node.train import TrainingConfig, build_model, model_state

    params = sum(
        t.numel() for t in model_state(build_model(TrainingConfig.from_dict(TRAINING))).values()
    )
    print(
        f"bench/round.py: {PEERS} peers on loopback, {params:,} parameters "
        f"({params * 4 / 1e6:.1f} MB per f32 update), {args.rounds} rounds, "
        f"{os.cpu_count()} CPUs, codecs {', '.join(args.codec)}"
    )
    skip = args.rounds > 1  # the first round includes warm-up (allocations, first connections)
    results: dict[str, dict[str, float]] = {}
    for codec in args.codec:
        cnode = _run(_cnode_peer, lambda i, tmp, out, c=codec: (i, tmp, args.rounds, out, c))
        results[codec] = _report_cnode(codec, cnode, skip)
    if "f32" in results:
        for codec, rows in results.items():
            if codec != "f32":
                ratio = rows["update_bytes"] / results["f32"]["update_bytes"]
                fetched = rows["fetched_bytes"] / results["f32"]["fetched_bytes"]
                print(
                    f"\n{codec} vs f32: update bytes {ratio:.3f}x, fetched bytes {fetched:.3f}x, "
                    f"round {rows['round'] / results['f32']['round']:.2f}x"
                )
    if args.no_baseline:
        sys.stdout.flush()
        return
    base = _run(
        _allreduce_peer,
        lambda i, tmp, out: (i, f"file://{tmp}/rendezvous", args.rounds, out),
    )
    b_rows = [(k, _median(base, k, skip)) for k in ("train", "wait", "allreduce", "round")]
    print("\nall-reduce baseline (gloo, same model and step, float32), seconds:")
    for key, value in b_rows:
        print(f"  {key:<10} {value:8.3f}")
    allreduce = dict(b_rows)["allreduce"]
    for codec, rows in results.items():
        exchange = rows["fetch"] + rows["aggregate"]
        comm = rows["publish"] + exchange
        print(
            f"{codec}: fetch+aggregate {exchange:.3f} s, ratio {exchange / allreduce:.2f}x to "
            f"the all-reduce {allreduce:.3f} s; publish+fetch+aggregate {comm:.3f} s, "
            f"{comm / allreduce:.2f}x"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
