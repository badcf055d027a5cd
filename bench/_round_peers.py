"""The peer processes of ``bench/round.py``: cnode peers (full or partitioned rounds) and gloo.

Each function here is the body of one spawned process. A cnode peer is a real py-libp2p node with
a real BlockStore and a :class:`NodeTrainer`; peers find each other, and (partitioned mode) learn
each partition's result CID, through small files in the run's work directory. That file
coordination is bench-only: it stands in for the coordinator, which the bench leaves out (it adds
a few small HTTP requests per round). Every wait is bounded by ``WAIT_S``.

A peer writes one JSON list to its ``out`` file: per round, the seconds of each phase and the
bytes it received (see ``round.py``'s docstring for the phases).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

WAIT_S = 300.0  # the longest any peer waits for the others at one step (bounded waits)
# Attempts per fetch. On 2 cores with 16 peer processes a holder's event loop can starve past
# the block exchange's NO_PROGRESS_TIMEOUT_S; the live node retries too. A failed attempt's
# blocks are kept but its bytes are not counted (FetchError counts blocks): ``retries`` says.
FETCH_TRIES = 3
# Fetches one peer runs at once (each from one holder): with 16 processes on 2 cores, a holder
# serving 15 requesters at once starves past NO_PROGRESS_TIMEOUT_S.
FETCH_CONCURRENCY = 4
RUN = "bench"


def quiet() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def post(path: Path, text: str) -> None:
    """Write a coordination file atomically (readers never see it half written)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def wait_files(work: Path, prefix: str, n: int, suffix: str = "") -> list[str]:
    """The texts of ``{prefix}{i}{suffix}`` for i < n, once all exist (at most WAIT_S)."""
    import trio

    with trio.fail_after(WAIT_S):
        while True:
            paths = [work / f"{prefix}{i}{suffix}" for i in range(n)]
            if all(p.exists() for p in paths):
                return [p.read_text() for p in paths]
            await trio.sleep(0.02)


# -- cnode peers -------------------------------------------------------------------------------


def cnode_peer(index: int, spec: dict[str, Any], work: str, out: str) -> None:
    """Process body: one cnode peer playing ``spec["rounds"]`` rounds in ``spec["mode"]``."""
    import torch

    torch.set_num_threads(1)
    quiet()
    import trio

    timings = trio.run(_cnode_peer_async, index, spec, Path(work))
    Path(out).write_text(json.dumps(timings))


async def _cnode_peer_async(index: int, spec: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    import trio

    from cnode.auth import Identity
    from cnode.node.p2p import P2PSettings, open_p2p_node
    from cnode.node.train import HeaderCollector, NodeTrainer, TrainingConfig, updates_topic
    from cnode.storage import BlockStore

    n = spec["peers"]
    identity = Identity.generate()
    store = BlockStore(work / f"peer{index}")
    config = TrainingConfig.from_dict({**spec["training"], "update_codec": spec["codec"]})
    trainer = await trio.to_thread.run_sync(
        lambda: NodeTrainer(config, run=RUN, identity=identity, store=store)
    )
    headers = HeaderCollector(RUN, lambda _peer: True)
    settings = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",), run_id=RUN)
    timings: list[dict[str, Any]] = []
    async with open_p2p_node(identity, store, settings, allow=lambda _p: True) as node:
        post(work / f"addr{index}", node.listen_addrs[0])
        addrs = await wait_files(work, "addr", n)
        with trio.fail_after(WAIT_S):
            for addr in addrs[:index]:  # one connection per pair: the later peer dials
                await node.connect(addr)
        peer = _Peer(index, spec, work, trainer, node, headers)
        peer.addrs = {a.rsplit("/p2p/", 1)[1]: a for a in addrs}
        async with trio.open_nursery() as nursery:

            async def drain() -> None:
                async with node.subscribe(updates_topic(RUN), headers) as sub:
                    async for _ in sub:
                        pass

            nursery.start_soon(drain)
            await trio.sleep(3 + n / 4)  # let the gossip mesh form (heartbeat 1 s)
            post(work / f"ready{index}", "")
            await wait_files(work, "ready", n)
            for round_ in range(1, spec["rounds"] + 1):
                timings.append(await peer.play(round_))
                post(work / f"done{index}.{round_}", "")
                await wait_files(work, "done", n, suffix=f".{round_}")
            nursery.cancel_scope.cancel()
    return timings


class _Peer:
    """One cnode peer's rounds (the phases are timed here)."""

    def __init__(
        self, index: int, spec: dict[str, Any], work: Path, trainer: Any, node: Any, headers: Any
    ) -> None:
        self.index, self.spec, self.work = index, spec, work
        self.n = spec["peers"]
        self.trainer, self.node, self.headers = trainer, node, headers
        self.store = trainer.store
        self.addrs: dict[str, str] = {}  # peer id -> listen address
        import trio

        self.limiter = trio.CapacityLimiter(FETCH_CONCURRENCY)

    async def _tries(self, t: dict[str, Any], holder: str, fetch: Any, *args: Any) -> Any:
        """``await fetch(*args)``; on FetchError redial ``holder`` and again, FETCH_TRIES
        times at most (under load py-libp2p may drop a connection)."""
        import trio

        from cnode.node.p2p import FetchError, P2PError

        for attempt in range(FETCH_TRIES):
            try:
                async with self.limiter:
                    return await fetch(*args)
            except FetchError:
                if attempt == FETCH_TRIES - 1:
                    raise
                t["retries"] += 1
                # the next attempt says whether a failed redial matters
                with trio.move_on_after(30), contextlib.suppress(P2PError):
                    await self.node.connect(self.addrs[holder])
        raise AssertionError("unreachable")

    async def _barrier(self, name: str, round_: int, t: dict[str, Any]) -> None:
        """Every peer reached ``name`` of this round; the time waited counts as ``wait``."""
        began = time.perf_counter()
        post(self.work / f"{name}{self.index}.{round_}", "")
        await wait_files(self.work, name, self.n, suffix=f".{round_}")
        t["wait"] += time.perf_counter() - began

    async def play(self, round_: int) -> dict[str, Any]:
        import trio

        from cnode.node.train import header_cid, updates_topic
        from cnode.storage import manifest_closure

        t: dict[str, Any] = dict.fromkeys(
            ("wait", "fetch", "scores", "aggregate", "results", "verify", "assemble"), 0.0
        )
        t.update(fetched_bytes=0, verify_bytes=0, score_bytes=0, retries=0)
        t0, c0 = time.perf_counter(), time.process_time()
        own = await trio.to_thread.run_sync(self.trainer.train, round_)
        t["train"] = own.local.seconds
        t1 = time.perf_counter()
        self.headers.seen[(round_, self.trainer.peer)] = (own.envelope, own.header)
        await self.node.publish(updates_topic(RUN), own.envelope)
        t["publish"] = time.perf_counter() - t1 + own.seconds_store
        t["cpu_train_publish"] = time.process_time() - c0
        t2 = time.perf_counter()
        with trio.fail_after(WAIT_S):  # the slowest trainer, and gossip
            while sum(1 for (r, _p) in self.headers.seen if r == round_) < self.n:
                await trio.sleep(0.005)
        t["wait"] += time.perf_counter() - t2
        mine: dict[str, Any] = {}
        for (r, peer), (envelope, header) in list(self.headers.seen.items()):
            if r == round_:
                cid = header_cid(envelope)
                if not self.store.has(cid):
                    self.store.put(cid, envelope)
                mine[peer] = (cid, header)
        if self.spec["mode"] == "full":
            await self._full(round_, mine, t)
        else:
            await self._partitioned(round_, mine, t)
        t["round"] = time.perf_counter() - t0
        t["state"] = str(self.trainer.state_cid)
        t["update_bytes"] = sum(
            self.store.size(c) for c in manifest_closure(self.store, own.header.update)
        )
        return t

    # -- full replication: fetch every update, aggregate everything ----------------------------

    async def _full(self, round_: int, mine: dict[str, Any], t: dict[str, Any]) -> None:
        import trio

        me = self.trainer.peer
        t3, c3 = time.perf_counter(), time.process_time()

        async def fetch(update: Any, peer: str) -> None:
            got = (await self._tries(t, peer, self.node.fetch, update, [peer])).bytes
            t["fetched_bytes"] += got

        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as fetches:
                for peer, (_cid, header) in mine.items():
                    if peer != me:
                        fetches.start_soon(fetch, header.update, peer)
        t["fetch"] = time.perf_counter() - t3
        t["cpu_fetch"] = time.process_time() - c3
        # Wait until every peer has fetched, so no peer serves blocks (GIL-bound, in the main
        # thread) while it aggregates: each phase is then timed on its own.
        await self._barrier("fetched", round_, t)
        t4, c4 = time.perf_counter(), time.process_time()
        await trio.to_thread.run_sync(self.trainer.aggregate, round_, mine, {})
        t["aggregate"] = time.perf_counter() - t4
        t["cpu_aggregate"] = time.process_time() - c4

    # -- partitioned: aggregate one partition, fetch the others' results, verify some ----------

    async def _partitioned(self, round_: int, mine: dict[str, Any], t: dict[str, Any]) -> None:
        import trio

        from cnode.aggregation import (
            assign_partitions,
            partition_count,
            partition_segments,
            segment_ranges,
        )
        from cnode.aggregation.limits import SEGMENTS
        from cnode.node.train import fetch_update_segments, partition_result_cid

        me, trainer, node = self.trainer.peer, self.trainer, self.node
        parts = partition_count(self.n, SEGMENTS)
        aggregators = assign_partitions(RUN, round_, sorted(mine), parts)
        numel = sum(x.numel() for x in trainer.state.values())
        count = len(segment_ranges(numel))
        own_parts = [p for p, a in enumerate(aggregators) if a == me]

        def indices_of(partitions: list[int]) -> list[int]:
            return sorted({i for p in partitions for i in partition_segments(count, parts, p)})

        async def segments(peer: str, indices: list[int], key: str) -> None:
            update = mine[peer][1].update
            got = await self._tries(t, peer, fetch_update_segments, node, update, indices, [peer])
            t[key] += got  # (read t[key] after the await: tasks run concurrently)

        # fetch: this peer's partitions of every other update, from its author
        t3, c3 = time.perf_counter(), time.process_time()
        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for peer in mine:
                    if peer != me and own_parts:
                        nursery.start_soon(segments, peer, indices_of(own_parts), "fetched_bytes")
        t["fetch"] = time.perf_counter() - t3
        t["cpu_fetch"] = time.process_time() - c3
        await self._barrier("fetched", round_, t)  # as in full mode: phases timed apart
        if trainer.scoring is not None:
            await self._scores(round_, mine, t)
            await self._barrier("scored", round_, t)
        # aggregate: CenteredClip of the partition, its output stored, the result signed
        t4, c4 = time.perf_counter(), time.process_time()
        results: dict[int, tuple[Any, Any]] = {}
        for p in own_parts:
            envelope, result = await trio.to_thread.run_sync(
                lambda p=p: trainer.aggregate_partition(
                    round_, mine, partition=p, parts=parts, missing={}
                )
            )
            cid = partition_result_cid(envelope)
            if not self.store.has(cid):
                self.store.put(cid, envelope)
            results[p] = (cid, result)
        t["aggregate"] = time.perf_counter() - t4
        t["cpu_aggregate"] = time.process_time() - c4
        for p, (cid, _result) in results.items():  # bench-only: the result CID in a file
            post(self.work / f"result{p}.{round_}", f"{cid}\n{me}")
        t5 = time.perf_counter()
        posted = await wait_files(self.work, "result", parts, suffix=f".{round_}")
        t["wait"] += time.perf_counter() - t5
        # results: every other partition's signed result and its output, from its aggregator
        t6, c6 = time.perf_counter(), time.process_time()
        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for p, text in enumerate(posted):
                    if p not in results:
                        nursery.start_soon(self._fetch_result, round_, p, parts, text, results, t)
        t["results"] = time.perf_counter() - t6
        t["cpu_results"] = time.process_time() - c6
        # verify: VERIFY partitions chosen by a seed fixed by all results: fetch their inputs...
        t7, c7 = time.perf_counter(), time.process_time()
        seed = hashlib.sha256("\n".join(sorted(str(c) for c, _ in results.values())).encode())
        from cnode.aggregation import verification_choice

        chosen = verification_choice(seed.digest(), me, parts, self.spec["verify"], own_parts)
        wanted: dict[str, list[int]] = {}  # member -> the chosen partitions it is an input of
        for q in chosen:
            for member, hcid in results[q][1].inputs.items():
                if mine[member][0] != hcid:
                    raise AssertionError(f"partition {q} names another header of {member}")
                if member != me:
                    wanted.setdefault(member, []).append(q)
        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for member, qs in wanted.items():  # one partial fetch per update
                    nursery.start_soon(segments, member, indices_of(qs), "verify_bytes")
        t["verify_fetch"] = time.perf_counter() - t7
        t["cpu_verify_fetch"] = time.process_time() - c7
        await self._barrier("verifetched", round_, t)
        # ... and recompute them: the output CID must be the one the aggregator signed
        t8, c8 = time.perf_counter(), time.process_time()
        for q in chosen:
            cid, result = results[q]
            if result.base != trainer.state_cid:
                raise AssertionError(f"partition {q} was aggregated on another state")
            inputs = {m: mine[m] for m in result.inputs}
            _env, again = await trio.to_thread.run_sync(
                lambda q=q, inputs=inputs: trainer.aggregate_partition(
                    round_, inputs, partition=q, parts=parts, missing={}
                )
            )
            if again.output != result.output:
                raise AssertionError(f"partition {q}: {again.output} != {result.output}")
        t["verify_compute"] = time.perf_counter() - t8
        t["cpu_verify_compute"] = time.process_time() - c8
        t["verify"] = t["verify_fetch"] + t["verify_compute"]
        t["verified"] = len(chosen)
        # assemble: the new state from every partition's output
        t9, c9 = time.perf_counter(), time.process_time()
        outputs = {p: r.output for p, (_c, r) in results.items()}
        await trio.to_thread.run_sync(
            lambda: trainer.apply_partitions(round_, results, outputs, parts=parts, dropped={})
        )
        t["assemble"] = time.perf_counter() - t9
        t["cpu_assemble"] = time.process_time() - c9

    async def _scores(self, round_: int, mine: dict[str, Any], t: dict[str, Any]) -> None:
        """As a partitioned round with scores: this peer's score targets (targets_of), each
        update whole from its author, and their four losses (RoundScoring.measure_targets). The
        bench then aggregates every input (no admission: the records are not exchanged)."""
        import trio

        from cnode.aggregation import score_seed
        from cnode.node.train import load_update
        from cnode.node.train.scores import targets_of

        trainer, me = self.trainer, self.trainer.peer
        seed = score_seed(str(cid) for cid, _header in mine.values())
        targets = [p for p in targets_of(RUN, round_, sorted(mine), me) if p != me]
        began, cpu = time.perf_counter(), time.process_time()

        async def fetch(peer: str) -> None:
            got = await self._tries(t, peer, self.node.fetch, mine[peer][1].update, [peer])
            t["score_bytes"] += got.bytes

        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for peer in targets:
                    nursery.start_soon(fetch, peer)

        def measure() -> None:  # as the node does: every target at once (measure_targets)
            assert trainer.scoring is not None
            updates = {
                peer: load_update(
                    trainer.store, mine[peer][1].update, peer=peer,
                    codec=trainer.config.wire_codec, shapes=trainer.state,
                )
                for peer in targets
            }  # fmt: skip
            trainer.scoring.measure_targets(round_, seed, trainer.state, updates)

        await trio.to_thread.run_sync(measure)
        t["scores"] = time.perf_counter() - began
        t["cpu_scores"] = time.process_time() - cpu

    async def _fetch_result(
        self,
        round_: int,
        p: int,
        parts: int,
        text: str,
        results: dict[int, tuple[Any, Any]],
        t: dict[str, Any],
    ) -> None:
        from cnode.node.train import open_partition_result
        from cnode.storage import CID

        cid_text, aggregator = text.split("\n")
        cid = CID.parse(cid_text)
        got = (await self._tries(t, aggregator, self.node.fetch_blocks, [cid], [aggregator])).bytes
        result = open_partition_result(
            self.store.get(cid), run=RUN, round_=round_, signer=aggregator
        )
        if result.partition != p or result.parts != parts:
            raise AssertionError(f"result {cid} is not partition {p} of {parts}")
        if result.output is not None:
            got += (
                await self._tries(t, aggregator, self.node.fetch, result.output, [aggregator])
            ).bytes
        t["fetched_bytes"] += got
        results[p] = (cid, result)


# -- all-reduce baseline -----------------------------------------------------------------------


def allreduce_peer(index: int, spec: dict[str, Any], init: str, out: str) -> None:
    """Process body: the same model and step, then ``all_reduce(delta) / N`` over gloo."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    quiet()
    from cnode.node.train import TextData, TrainingConfig, build_model, model_state, train_local

    n = spec["peers"]
    dist.init_process_group("gloo", init_method=init, rank=index, world_size=n)
    config = TrainingConfig.from_dict(spec["training"])
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    state = model_state(model)
    timings = []
    for round_ in range(1, spec["rounds"] + 1):
        dist.barrier()
        t0 = time.perf_counter()
        local = train_local(model, state, data, config, peer_id=f"peer{index}", round_=round_)
        t1 = time.perf_counter()
        dist.barrier()  # the same "wait for the slowest trainer" as the cnode peers
        t_wait = time.perf_counter() - t1
        t2 = time.perf_counter()
        flat = torch.cat([local.delta[k].reshape(-1) for k in state])
        dist.all_reduce(flat)
        flat /= n
        offset = 0
        for k in state:
            size = state[k].numel()
            state[k] = state[k] + flat[offset : offset + size].view_as(state[k])
            offset += size
        t_allreduce = time.perf_counter() - t2
        timings.append({"train": t1 - t0, "wait": t_wait, "allreduce": t_allreduce})
        timings[-1]["round"] = time.perf_counter() - t0
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(timings))
