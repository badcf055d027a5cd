"""How far score losses move with the arithmetic, and what scoring costs beside training (issue 26).

On a model trained for a few rounds, with real updates of --targets peers (their local steps
from that state), each target's four score losses are computed in:

* CPU float64 (the reference: every score before issue 26),
* CPU float32 with all threads and with one thread,
* CPU bf16 autocast (weights float32),
* and, where torch sees CUDA, CUDA float32 and CUDA bf16 autocast.

For each arithmetic it prints the largest relative loss error against the reference, the
largest error of the real-valued score x = (before - after) / before / SCORE_UNIT (in score
units), how many integer scores differ from the reference's, and how many targets the settle
rule (scores/_settle.py: reference within BOUNDARY_UNITS of a rounding boundary) would send to
the reference. SCORE_DEVICE_RTOL is set from the float32 rows.

Then the cost: seconds of one round's local training at the run's default settings
(local_steps 16 x batch 8), of RoundScoring.score of 4 updates (a full-replication round of 4)
and of 2 targets (one member's share in a partitioned round), the old float64 path against the
fast one, and their ratios to the training time.

    flock /tmp/cnode-heavy.lock nice -n 5 .venv/bin/python bench/score_precision.py
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from collections.abc import Callable

import structlog
import torch

from cnode.aggregation import draw_indices, score_seed, score_update
from cnode.aggregation import limits as agg_limits
from cnode.node.train import TextData, TrainingConfig, build_model, model_state, train_local
from cnode.node.train.limits import SCORE_DEVICE_RTOL, SCORE_SEQUENCES
from cnode.node.train.model import Placement
from cnode.node.train.scores import BOUNDARY_UNITS, RoundScoring, settle_needed

MODELS = {
    "demo10m": {"n_layer": 6, "n_embd": 368, "n_head": 4, "n_positions": 64},
    "tiny": {},
}
Losses = tuple[float, float, float, float]
REPEAT = 5  # timings of the 2-target scorer, one by one against batched: the median of each


def _x(before: float, after: float) -> float:
    return (before - after) / before / agg_limits.SCORE_UNIT


def _losses_in(
    config: TrainingConfig, dtype: torch.dtype, device: torch.device, bf16: bool
) -> Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor, torch.Tensor],
              Losses]:  # fmt: skip
    model = build_model(config).to(dtype).eval()
    torch.nn.Module.to(model, device)

    def run(state: dict, update: dict, own: torch.Tensor, held: torch.Tensor) -> Losses:
        out = []
        for weights in (state, {k: state[k] + agg_limits.SCORE_STEP * update[k] for k in state}):
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(weights[name].to(dtype))
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    out += [float(model(input_ids=b.to(device), labels=b.to(device)).loss)
                            for b in (own, held)]  # fmt: skip
        own_before, held_before, own_after, held_after = out
        return own_before, own_after, held_before, held_after

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="demo10m")
    ap.add_argument("--targets", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2, help="the all-threads runs' thread count")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(args.threads)
    config = TrainingConfig.for_run({"model": MODELS[args.model], "partitioned": "never"})
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    state = model_state(model)
    cpu = Placement(torch.device("cpu"))
    train_s = []
    for round_ in (1, 2):  # a state past its first steps, as scores see them in a run
        local = train_local(model, state, data, config, peer_id="warm", round_=round_)
        state = {k: state[k] + local.delta[k] for k in state}
        train_s.append(local.seconds)
    peers = [f"peer-{i}" for i in range(args.targets)]
    updates = {}
    for p in peers:
        local = train_local(model, state, data, config, peer_id=p, round_=3)
        updates[p] = local.delta
        train_s.append(local.seconds)
    seed = score_seed(["bench"])
    n = SCORE_SEQUENCES
    held = data.eval[torch.tensor(draw_indices(seed, "held", len(data.eval), n))]
    batches = {}
    for p in peers:
        shard = data.shard(p, 3, seed=config.seed)
        batches[p] = (data.train[shard[draw_indices(seed, f"own:{p}", len(shard), n)]], held)
    params = sum(t.numel() for t in state.values())
    print(f"score_precision: {args.model} ({params:,} parameters), {args.targets} real updates, "
          f"{n} sequences per batch, BOUNDARY_UNITS {BOUNDARY_UNITS:.3f} "
          f"(SCORE_DEVICE_RTOL {SCORE_DEVICE_RTOL:g})")  # fmt: skip
    ways: list[tuple[str, torch.dtype, torch.device, bool, int]] = [
        ("cpu float64", torch.float64, torch.device("cpu"), False, args.threads),
        ("cpu float32", torch.float32, torch.device("cpu"), False, args.threads),
        ("cpu float32 1 thread", torch.float32, torch.device("cpu"), False, 1),
        ("cpu bf16-mixed", torch.float32, torch.device("cpu"), True, args.threads),
    ]
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        ways += [("cuda float32", torch.float32, cuda, False, args.threads),
                 ("cuda bf16-mixed", torch.float32, cuda, True, args.threads)]  # fmt: skip
    results: dict[str, dict[str, Losses]] = {}
    for name, dtype, device, bf16, threads in ways:
        torch.set_num_threads(threads)
        run = _losses_in(config, dtype, device, bf16)
        results[name] = {p: run(state, updates[p], *batches[p]) for p in peers}
    torch.set_num_threads(args.threads)
    ref = results["cpu float64"]
    print(f"{'arithmetic':22s} {'max rel loss err':>16s} {'max |dx| units':>15s} "
          f"{'ints differ':>11s} {'settled':>8s}")  # fmt: skip
    for name, got in results.items():
        rel = max(abs(a - b) / abs(b) for p in peers for a, b in zip(got[p], ref[p], strict=True))
        dx, differ, settled = 0.0, 0, 0
        for p in peers:
            g, r = got[p], ref[p]
            for (gb, ga), (rb, ra) in (((g[0], g[1]), (r[0], r[1])), ((g[2], g[3]), (r[2], r[3]))):
                dx = max(dx, abs(_x(gb, ga) - _x(rb, ra)))
                differ += round(_x(gb, ga)) != round(_x(rb, ra))
            settled += settle_needed(g)
        print(f"{name:22s} {rel:16.2e} {dx:15.4f} {differ:6d}/{2 * len(peers):<4d} "
              f"{settled:4d}/{len(peers)}")  # fmt: skip
    _costs(config, data, state, updates, peers, statistics.median(train_s), cpu)


def _costs(
    config: TrainingConfig,
    data: TextData,
    state: dict[str, torch.Tensor],
    updates: dict[str, dict[str, torch.Tensor]],
    peers: list[str],
    train_s: float,
    cpu: Placement,
) -> None:
    four = {p: updates[p] for p in peers[:4]}
    headers = {p: f"bafy-header-{i}" for i, p in enumerate(four)}
    placements = [("cpu float32 (fast)", cpu)]
    if torch.cuda.is_available():
        placements.append(("cuda float32 (fast)", Placement(torch.device("cuda"))))
    print(f"local training, one round at the defaults (16 steps x batch 8), CPU: {train_s:.2f} s")
    old = _old_path(config, data, state, four, headers)
    rows = [("cpu float64 (before issue 26)", *old)]
    for name, placement in placements:
        scoring = RoundScoring(config, data, placement=placement)
        scoring.score(1, state, four, headers)  # warm-up: builds the models
        began = time.perf_counter()
        scoring.score(2, state, four, headers)
        full = time.perf_counter() - began
        seed = score_seed(headers.values())
        two_updates = {p: updates[p] for p in peers[:2]}
        one_by_one, batched = [], []
        for _ in range(REPEAT):  # interleaved, the median of each
            began = time.perf_counter()
            single = {p: scoring.measure(3, seed, state, p, u) for p, u in two_updates.items()}
            one_by_one.append(time.perf_counter() - began)
            began = time.perf_counter()
            together = scoring.measure_targets(3, seed, state, two_updates)
            batched.append(time.perf_counter() - began)
        same = all(
            score_update(p, *single[p]).score == score_update(p, *together[p]).score
            and score_update(p, *single[p]).own == score_update(p, *together[p]).own
            for p in two_updates
        )
        two, two_batched = statistics.median(one_by_one), statistics.median(batched)
        rows.append((name, full, two))
        print(f"  {name}: 2 targets one by one {two:.3f} s = {two / train_s:.1%} of training, "
              f"batched (measure_targets) {two_batched:.3f} s = {two_batched / train_s:.1%} "
              f"({two_batched / two:.2f}x); same integers: {same}")  # fmt: skip
    for name, full, two in rows:
        print(f"  {name:30s} 4 updates (full round) {full:6.2f} s = {full / train_s:6.1%} of "
              f"training; 2 targets (partitioned) {two:6.2f} s = {two / train_s:6.1%}")  # fmt: skip


def _old_path(
    config: TrainingConfig,
    data: TextData,
    state: dict[str, torch.Tensor],
    four: dict[str, dict[str, torch.Tensor]],
    headers: dict[str, str],
) -> tuple[float, float]:
    """The seconds of the float64-only path (every loss by the reference), same work."""
    scoring = RoundScoring(config, data)
    scoring.models.reference(state, None, [data.eval[:1]])  # warm-up: builds the model
    seed = score_seed(headers.values())
    began = time.perf_counter()
    held_done = False
    for p in sorted(four):
        own, held = scoring._batches(3, seed, p)
        if not held_done:
            scoring.models.reference(state, None, [held])
            held_done = True
        scoring.models.reference(state, None, [own])
        scoring.models.reference(state, four[p], [own, held])
    full = time.perf_counter() - began
    began = time.perf_counter()
    for p in sorted(four)[:2]:
        own, held = scoring._batches(3, seed, p)
        scoring.models.reference(state, None, [own, held])
        scoring.models.reference(state, four[p], [own, held])
    return full, time.perf_counter() - began


if __name__ == "__main__":
    assert math.isfinite(BOUNDARY_UNITS)
    main()
