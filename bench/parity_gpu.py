"""Loss parity in one process per run, on a GPU or the CPU (issue 26): bench/parity.py without
the network, and a sweep of outer-optimizer settings.

For a machine that has torch but not the network stack (bench/gpu_check.py's situation), and
when the 2-core box's heavy lock leaves no time for real swarms. Each round, the simulated nodes
run the node's own local steps (``train_local`` on ``--device``), their updates go through the
run's codec, and the run's aggregator and outer step (``outer_step``) give the next state, as
every node computes it. Not modelled: scores (every honest update is admitted, as they are in
an honest run; the attacker is left to the aggregator alone, i.e. ``scores = false``), partitions
(full replication) and the network.

**Runs** (``--runs``, comma-separated; each is a *spec*: an outer optimizer, then ``/key=value``
settings): ``sgd`` (the run default), ``nesterov`` (DiLoCo's 0.7 / 0.9), ``sgd/outer_lr=2``,
``nesterov/outer_lr=1/outer_momentum=0.5/attackers=1``. Keys: the run config's ``outer_lr``,
``outer_momentum``, ``local_steps``, ``lr``, ``seed``, ``n_shards`` (``training.data.n_shards``),
``assignment`` (``training.data.assignment``: ``rotate``, the run default, or ``fixed``), and
``inner`` (``training.inner_optimizer_state``: ``keep``, the run default, or ``fresh``; each
simulated node keeps its own moments, as a node does), ``attackers`` (gaussian attackers beside
the 4 honest nodes), ``names`` (``hashed``: nodes named
``node-0..3`` take whatever shard their name hashes to, as random peer ids do; ``distinct``, the
default: names whose shards differ in round 1, so under ``fixed`` the swarm covers as many
shards as it has nodes; under ``rotate`` each node walks through every shard anyway).
``baseline`` (or ``baseline/lr=...``) is one process, AdamW at the run's lr and batch size,
batches drawn from all shards. **Equal tokens**: a run takes ``--rounds x 16 / local_steps``
rounds, so every run ends at the same tokens as the baseline; its held-out loss is shown at
each baseline round it reaches (every 4 x 16 x batch sequences). Each run's final loss and the
mean of its last LAST (5) rounds are divided by the baseline's at the same rounds.

``--jobs N`` runs the specs in N processes at once (each with ``--threads`` torch threads).

    PYTHONPATH=.:.gpu-deps python bench/parity_gpu.py --rounds 40
    .venv/bin/python bench/parity_gpu.py --device cpu --rounds 20 --jobs 2 \\
        --runs baseline,sgd,sgd/outer_lr=2,nesterov/outer_lr=1/outer_momentum=0.5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import _import_training  # the lean import, shared

NODES = 4
BASE_LOCAL_STEPS = 16  # a baseline "round" is NODES x this many steps: the default run's tokens
LAST = 5  # the last rounds whose mean is also compared (a round's loss is noisy)
DEFAULT_RUNS = "baseline,sgd,nesterov,nesterov/attackers=1"
CONFIG_KEYS = {"outer_lr": float, "outer_momentum": float, "local_steps": int, "lr": float,
               "seed": int, "inner": str}  # fmt: skip
BENCH_KEYS = {"attackers": int, "n_shards": int, "assignment": str, "names": str}


def parse_spec(spec: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``opt/key=value/...`` -> (optimizer or "baseline", run-config keys, bench keys)."""
    head, *parts = spec.split("/")
    if head not in ("baseline", "sgd", "nesterov"):
        raise SystemExit(f"parity_gpu: run {spec!r}: starts with baseline, sgd or nesterov")
    config: dict[str, Any] = {}
    bench: dict[str, Any] = {"attackers": 0, "names": "distinct"}
    for part in parts:
        key, _, value = part.partition("=")
        kind = CONFIG_KEYS.get(key) or BENCH_KEYS.get(key)
        if kind is None or not value:
            raise SystemExit(f"parity_gpu: run {spec!r}: unknown setting {part!r}")
        (config if key in CONFIG_KEYS else bench)[key] = kind(value)
    if bench["names"] not in ("hashed", "distinct"):
        raise SystemExit(f"parity_gpu: run {spec!r}: names is hashed or distinct")
    if head == "nesterov":
        config["outer_optimizer"] = "nesterov"
    return head, config, bench


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40, help="baseline rounds (equal tokens)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated specs (docstring)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, one process each")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's)")
    ap.add_argument("--out", type=Path, help="also write the curves and ratios here as JSON")
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("parity_gpu: skipped: torch sees no CUDA device")
        return 0
    specs = [s for s in args.runs.split(",") if s]
    for spec in specs:
        parse_spec(spec)  # every spec checked before anything runs
    began = time.perf_counter()
    curves: dict[str, list[float | None]] = {}
    if args.jobs > 1 and len(specs) > 1:
        curves = _in_processes(specs, args)
    else:
        for spec in specs:
            curves[spec] = run_spec(spec, args.rounds, args.device, args.threads)
            print(f"parity_gpu: {spec} done at {time.perf_counter() - began:.0f} s", flush=True)
    _print(curves, args, time.perf_counter() - began)
    return 0


def run_spec(spec: str, rounds: int, device_name: str, threads: int) -> list[float | None]:
    """One run's held-out loss at each baseline round it reaches."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    _import_training()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from cnode.node.train import TrainingConfig
    from cnode.node.train.model import TextData

    head, keys, bench = parse_spec(spec)
    raw: dict[str, Any] = {"scores": False, **keys}
    if "inner" in raw:
        raw["inner_optimizer_state"] = raw.pop("inner")
    raw["data"] = {k: bench[k] for k in ("n_shards", "assignment") if k in bench}
    config = TrainingConfig.for_run(raw)
    data = TextData.build(config.data, config.model)
    device = torch.device(device_name)
    if head == "baseline":
        return list(_baseline(config, data, device, rounds))
    tokens = rounds * BASE_LOCAL_STEPS  # in local steps of one node
    if tokens % config.local_steps:
        raise SystemExit(f"parity_gpu: run {spec!r}: {rounds} x {BASE_LOCAL_STEPS} steps is not "
                         f"a whole number of rounds of {config.local_steps}")  # fmt: skip
    losses = _swarm(config, data, device, tokens // config.local_steps, bench)
    # Swarm round s ends at s x local_steps steps a node, baseline round i at i x 16: the loss
    # at each baseline round that a swarm round ends on (None between them).
    return [
        losses[i * BASE_LOCAL_STEPS // config.local_steps - 1]
        if (i * BASE_LOCAL_STEPS) % config.local_steps == 0
        else None
        for i in range(1, rounds + 1)
    ]


def _in_processes(specs: list[str], args: argparse.Namespace) -> dict[str, list[float | None]]:
    """Each spec in a process of its own, ``args.jobs`` at once; their curves by spec."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    curves: dict[str, list[float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="parity-gpu-") as tmp:
        waiting = list(enumerate(specs))
        running: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        while waiting or running:
            while waiting and len(running) < args.jobs:
                i, spec = waiting.pop(0)
                out = Path(tmp) / f"{i}.json"
                code = (
                    "import json, sys; sys.argv = ['parity_gpu']; "
                    f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
                    "from parity_gpu import run_spec; "
                    f"c = run_spec({spec!r}, {args.rounds}, {args.device!r}, {threads}); "
                    f"open({str(out)!r}, 'w').write(json.dumps(c))"
                )
                running.append((spec, out, subprocess.Popen([sys.executable, "-c", code], env=env)))
            time.sleep(0.5)
            for item in list(running):
                spec, out, proc = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                if proc.returncode != 0 or not out.exists():
                    raise SystemExit(f"parity_gpu: run {spec!r} failed ({proc.returncode})")
                curves[spec] = json.loads(out.read_text())
                print(f"parity_gpu: {spec} done", flush=True)
    return {s: curves[s] for s in specs}


def _print(curves: dict[str, list[float | None]], args: argparse.Namespace, took: float) -> None:
    print(f"\nheld-out loss at equal tokens ({NODES} honest nodes, {args.device}, {took:.0f} s)")
    for i, spec in enumerate(curves):
        print(f"  [{i}] {spec}")
    print("round " + " ".join(f"{f'[{i}]':>8s}" for i in range(len(curves))))
    for r in range(args.rounds):
        cells = [c[r] if r < len(c) else None for c in curves.values()]
        print(f"{r + 1:5d} " + " ".join(f"{x:8.4f}" if x is not None else " " * 8 for x in cells))
    ratios = {}
    finals = {s: c[-1] for s, c in curves.items() if c and c[-1] is not None}
    # The first baseline (``baseline``, or one with settings: ``baseline/seed=1``) is the one.
    baseline = next((spec for spec in finals if spec.split("/")[0] == "baseline"), None)
    if baseline is not None:
        base = finals[baseline]
        for spec, final in finals.items():
            if spec.split("/")[0] != "baseline":
                ratios[spec] = final / base
                last = _last_ratio(curves, spec, baseline)
                print(f"final {final:.4f} / baseline {base:.4f} = {ratios[spec]:.4f} "
                      f"({ratios[spec] - 1:+.2%}); last {LAST} {last:.4f}  {spec}")  # fmt: skip
    if args.out is not None:
        figures = {"curves": curves, "ratios": ratios, "device": args.device, "seconds": took}
        args.out.write_text(json.dumps(figures))


def _last_ratio(curves: dict[str, list[float | None]], spec: str, baseline: str) -> float:
    """Mean of ``spec``'s losses over the last LAST baseline rounds it reaches, over the
    baseline's mean at the same rounds (one round's loss moves by about ±1 % on its own)."""
    tail = len(curves[baseline]) - LAST
    rounds = [i for i, x in enumerate(curves[spec]) if x is not None and i >= tail]
    ours = sum(curves[spec][i] or 0.0 for i in rounds)
    base = sum(curves[baseline][i] or 0.0 for i in rounds)
    return ours / base if base else float("nan")


def _baseline(config: Any, data: Any, device: Any, rounds: int) -> list[float]:
    import torch

    from cnode.node.train.model import build_model

    model = build_model(config)
    torch.nn.Module.to(model, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    out = []
    for _ in range(rounds):
        model.train()
        for _ in range(NODES * BASE_LOCAL_STEPS):
            pick = torch.randint(0, data.train.shape[0], (config.batch_size,), generator=generator)
            batch = data.train[pick].to(device)
            optimizer.zero_grad(set_to_none=True)
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
        out.append(_held_out(model, data, device))
    return out


def _held_out(model: Any, data: Any, device: Any) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        x = data.eval.to(device)
        return float(model(input_ids=x, labels=x).loss)


def node_names(count: int, data: Any, how: str, seed: int = 0) -> list[str]:
    """``count`` peer names: ``node-0..`` (hashed), or the first ``node-j`` whose shards in round
    1 differ while shards are free (distinct)."""
    if how == "hashed":
        return [f"node-{i}" for i in range(count)]
    names: list[str] = []
    used: set[int] = set()
    j = 0
    while len(names) < count:
        shard = data.shard_index(f"node-{j}", 1, seed=seed)
        if shard not in used or len(used) >= data.n_shards:
            names.append(f"node-{j}")
            used.add(shard)
        j += 1
    return names


def _swarm(config: Any, data: Any, device: Any, rounds: int, bench: dict[str, Any]) -> list[float]:
    import torch

    from cnode.aggregation import (
        ATTACKS,
        AggregatorConfig,
        TensorSpec,
        aggregate,
        decode_update_tensor,
        encode_update_tensor,
        flat_segments,
        unflatten_segments,
    )
    from cnode.node.train.model import (
        InnerMoments,
        Placement,
        build_model,
        load_state,
        model_state,
        outer_step,
        train_local,
    )

    model = build_model(config)
    state = model_state(model)
    torch.nn.Module.to(model, device)
    momentum = None
    place = Placement(device)
    rule = AggregatorConfig(name=config.aggregator, params=dict(config.aggregator_params))
    expected = {n: TensorSpec(tuple(t.shape), torch.float32) for n, t in state.items()}
    attack = ATTACKS["gaussian"]
    rng = torch.Generator().manual_seed(config.seed + 1)
    honest = node_names(NODES, data, bench["names"], config.seed)
    peers = honest + [f"attacker-{i}" for i in range(bench["attackers"])]
    keep = config.inner_optimizer_state == "keep"  # each node's own AdamW moments, as a node
    moments = {peer: InnerMoments() if keep else None for peer in peers}
    out = []
    for round_ in range(1, rounds + 1):
        updates = {}
        for peer in peers:
            delta = train_local(model, state, data, config, peer_id=peer, round_=round_,
                                placement=place, moments=moments[peer]).delta  # fmt: skip
            if peer not in honest:  # what `cnode train --attack gaussian` sends
                delta = attack([], delta, rng, 1, 1)
                delta = {k: t.to(torch.float32).contiguous() for k, t in delta.items()}
            segments = flat_segments(delta)
            decoded = [
                decode_update_tensor(encode_update_tensor(s, config.update_codec),
                                     config.update_codec, (s.numel(),))
                for s in segments
            ]  # fmt: skip
            updates[peer] = unflatten_segments(
                decoded, {n: tuple(t.shape) for n, t in delta.items()}
            )
        result = aggregate(updates, expected=expected, config=rule)
        state, momentum = outer_step(state, momentum, result.tensors, config)
        load_state(model, state)
        out.append(_held_out(model, data, device))
    return out


if __name__ == "__main__":
    sys.exit(main())
