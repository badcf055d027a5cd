"""The gloo all-reduce baseline of bench/round.py: N processes, the same model and local step,
``all_reduce(delta) / N`` over torch.distributed on loopback, then apply."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

JOIN_S = 600  # the longest the baseline may take before its processes are killed


def _peer(index: int, spec: dict[str, Any], init: str, out: str) -> None:
    """Process body: train one round's local steps, time the all-reduce of the delta."""
    import structlog
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from cnode.node.train import TextData, TrainingConfig, build_model, model_state, train_local

    n = spec["peers"]
    dist.init_process_group("gloo", init_method=init, rank=index, world_size=n)
    config = TrainingConfig.from_dict(spec["training"])
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    state = model_state(model)
    timings = []
    for round_ in range(1, spec["rounds"] + 1):
        local = train_local(model, state, data, config, peer_id=f"peer{index}", round_=round_)
        dist.barrier()  # every delta is ready: the all-reduce alone is timed
        began = time.perf_counter()
        flat = torch.cat([local.delta[k].reshape(-1) for k in state])
        dist.all_reduce(flat)
        flat /= n
        offset = 0
        for k in state:
            size = state[k].numel()
            state[k] = state[k] + flat[offset : offset + size].view_as(state[k])
            offset += size
        timings.append(time.perf_counter() - began)
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(timings))


def gloo_allreduce(peers: int, rounds: int, training: dict[str, Any]) -> float:
    """The median over peers and rounds (the first left out when rounds > 1) of the seconds one
    all-reduce of the float32 delta takes, and its apply. Every process is stopped."""
    ctx = mp.get_context("spawn")
    spec = {"peers": peers, "rounds": rounds, "training": training}
    with tempfile.TemporaryDirectory(prefix="cnode-bench-allreduce-") as tmp:
        outs = [str(Path(tmp) / f"out{i}.json") for i in range(peers)]
        init = f"file://{tmp}/rendezvous"
        procs = [ctx.Process(target=_peer, args=(i, spec, init, outs[i])) for i in range(peers)]
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + JOIN_S
            while any(p.exitcode is None for p in procs):
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    why = f"exit {failed[0]}" if failed else f"over {JOIN_S} s"
                    raise SystemExit(f"an all-reduce process failed ({why})")
                time.sleep(0.2)
            times = [json.loads(Path(o).read_text()) for o in outs]
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
    skip = 1 if rounds > 1 else 0
    return float(statistics.median(t for peer in times for t in peer[skip:]))
