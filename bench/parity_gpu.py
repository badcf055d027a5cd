"""Loss parity in one process on a GPU machine (issue 26): bench/parity.py without the network.

For a machine that has torch but not the network stack (bench/gpu_check.py's situation), and
when the 2-core box's heavy lock leaves no time for real swarms. Each round, NODES simulated
nodes run the node's own local steps (``train_local`` on ``--device``), their updates go through
the run's codec, and the run's aggregator and outer step (``outer_step``) give the next state, as
every node computes it. Not modelled: scores (every honest update is admitted, as they are in
an honest run; the attacker is left to the aggregator alone, i.e. ``scores = false``), partitions
(full replication) and the network. The baseline is bench/parity.py's: one process, AdamW, all
shards, the same batch size and tokens.

    PYTHONPATH=.:.gpu-deps python bench/parity_gpu.py --rounds 40
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import _import_training  # the lean import, shared

NODES = 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("parity_gpu: skipped: torch sees no CUDA device")
        return 0
    _import_training()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from cnode.node.train import TrainingConfig
    from cnode.node.train.model import TextData, build_model

    base = TrainingConfig.for_run({"scores": False})
    data = TextData.build(base.data, base.model)
    device = torch.device(args.device)
    curves: dict[str, list[float]] = {}
    began = time.perf_counter()
    curves["baseline"] = _baseline(base, data, device, args.rounds, build_model)
    for run, extra, attackers in (
        ("sgd", {}, 0),
        ("nesterov", {"outer_optimizer": "nesterov"}, 0),
        ("attack", {"outer_optimizer": "nesterov"}, 1),
    ):
        config = TrainingConfig.for_run({"scores": False, **extra})
        curves[run] = _swarm(config, data, device, args.rounds, attackers)
        print(f"parity_gpu: {run} done at {time.perf_counter() - began:.0f} s", flush=True)
    print(f"\nheld-out loss per round ({NODES} nodes, default settings, {args.device})")
    print("round " + " ".join(f"{r:>10s}" for r in curves))
    for i in range(args.rounds):
        print(f"{i + 1:5d} " + " ".join(f"{c[i]:10.4f}" for c in curves.values()))
    ratios = {r: curves[r][-1] / curves["baseline"][-1] for r in curves if r != "baseline"}
    for run, ratio in ratios.items():
        print(f"{run:9s} final {curves[run][-1]:.4f} / baseline {curves['baseline'][-1]:.4f}"
              f" = {ratio:.4f} ({ratio - 1:+.2%})")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps({"curves": curves, "ratios": ratios}))
    return 0


def _baseline(config: Any, data: Any, device: Any, rounds: int, build_model: Any) -> list[float]:
    import torch

    model = build_model(config)
    torch.nn.Module.to(model, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    out = []
    for _ in range(rounds):
        model.train()
        for _ in range(NODES * config.local_steps):
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


def _swarm(config: Any, data: Any, device: Any, rounds: int, attackers: int) -> list[float]:
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
    out = []
    for round_ in range(1, rounds + 1):
        updates = {}
        for i in range(NODES + attackers):
            peer = f"node-{i}"
            delta = train_local(model, state, data, config, peer_id=peer, round_=round_,
                                placement=place).delta  # fmt: skip
            if i >= NODES:  # what `cnode train --attack gaussian` sends
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
