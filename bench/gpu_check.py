"""bench/gpu_check.py: local steps on a CUDA GPU beside a CPU node in one run, one state CID.

Two nodes of one run, in one process: "gpu" trains its local steps with ``--device cuda`` in
``--precision`` (bf16-mixed by default), "cpu" trains on the CPU in fp32. Every round each
update goes through the run's codec (the bytes a node would publish), then each node, on its own,
decodes both updates, aggregates them with the run's rule and takes the outer step (nesterov, so
the momentum is checked too) on the CPU in float32, as ``cnode train`` does. The "cpu" node does
its CPU work with one torch thread, the "gpu" node with all: the state must not depend on either.
The check passes when both nodes hold the same state CID and momentum bytes after every round.

It prints seconds per local step on each device and their ratio, and the held-out loss of the
final state computed four ways (CPU float64, CPU float32, CUDA float32, CUDA bf16 autocast): the
differences that scores computed on different hardware must tolerate (issue 26).

In process, not as ``cnode train`` processes: a bare GPU machine has torch and transformers but
not the network stack (py-libp2p pins binary wheels such as fastecdsa that do not install
offline). So the check imports the training modules without ``cnode.node.train``'s package
``__init__`` (which starts with the network loop), and needs beside torch, transformers and
tokenizers only the pure-Python wheels ``make gpu-deps`` puts in ``.gpu-deps``:

    make gpu-deps                                   # here, once: ~2.4 MB, pure Python
    PYTHONPATH=.:.gpu-deps python bench/gpu_check.py   # on the GPU machine, from the checkout

Takes about a minute on one H100/H200 (most of it the CPU node's steps). Without CUDA it says it
skipped and exits 0. Exit status 1 when the two nodes' states differ.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _import_training() -> None:
    """Make ``cnode.node.train``'s sub-modules importable, with or without an installed cnode
    and with or without the network stack."""
    sys.path.insert(0, str(ROOT))
    import cnode

    if importlib.util.find_spec("cnode.node") is None:
        # A plain checkout on PYTHONPATH: the distribution maps node/, storage/, aggregation/
        # and auth/ into cnode (pyproject's package-dir); the same mapping, for this process.
        cnode.__path__.append(str(ROOT))
    if "cnode.node.train" not in sys.modules and importlib.util.find_spec("libp2p") is None:
        # The package __init__ imports the network loop (libp2p): stand in for it with a
        # package that loads its sub-packages on demand and names the one public class of its
        # own this check uses (TrainingConfig, from the module the __init__ takes it from).
        import cnode.node

        package = types.ModuleType("cnode.node.train")
        package.__path__ = [str(ROOT / "node" / "train")]
        sys.modules["cnode.node.train"] = package
        # Likewise its scores sub-package (its __init__ opens signed records: libp2p keys).
        scores = types.ModuleType("cnode.node.train.scores")
        scores.__path__ = [str(ROOT / "node" / "train" / "scores")]
        sys.modules["cnode.node.train.scores"] = scores
        config = importlib.import_module("cnode.node.train._config")
        package.TrainingConfig = config.TrainingConfig  # type: ignore[attr-defined]


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--precision", choices=("fp32", "bf16-mixed"), default="bf16-mixed")
    parser.add_argument(
        "--device",
        default="cuda",
        help="the GPU node's device: cuda, cuda:N (cpu only to try this script without a GPU)",
    )
    parser.add_argument(
        "--model",
        choices=("demo10m", "tiny"),
        default="demo10m",
        help="demo10m: bench/round.py's 10.2M-parameter model; tiny: the default run's",
    )
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    return parser.parse_args()


MODELS = {
    "demo10m": {"n_layer": 6, "n_embd": 368, "n_head": 4, "n_positions": 64},
    "tiny": {},
}


def main() -> int:
    args = _args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: skipped: torch {torch.__version__} sees no CUDA device")
        return 0
    _import_training()
    from cnode.aggregation import (
        AggregatorConfig,
        aggregate,
        decode_update_tensor,
        encode_update_tensor,
        flat_segments,
        unflatten_segments,
    )
    from cnode.node.train import TrainingConfig
    from cnode.node.train.model import (
        Placement,
        TextData,
        build_model,
        model_state,
        outer_step,
        resolve_device,
        state_cid,
        train_local,
        zero_momentum,
    )

    config = TrainingConfig.for_run(
        {
            "model": MODELS[args.model],
            "local_steps": args.local_steps,
            "batch_size": args.batch_size,
            "update_codec": "int8-blockwise",
            "outer_optimizer": "nesterov",
            "scores": False,
        }
    )
    device, said = resolve_device(args.device)
    places = {
        "gpu": Placement(device, args.precision, said),
        "cpu": Placement(torch.device("cpu"), "fp32", "cpu"),
    }
    threads = {"gpu": torch.get_num_threads(), "cpu": 1}
    data = TextData.build(config.data, config.model)
    models = {}
    for name, place in places.items():
        models[name] = build_model(config)
        torch.nn.Module.to(models[name], place.device)
    genesis = model_state(models["cpu"])
    state = {name: dict(genesis) for name in places}
    momentum = {name: zero_momentum(genesis) for name in places}
    params = sum(t.numel() for t in genesis.values())
    print(
        f"gpu_check: {params:,} parameters, {config.local_steps} local steps x batch "
        f"{config.batch_size} x {config.data.seq_len} tokens, codec {config.update_codec}, "
        f"outer nesterov; gpu node: {said}, {args.precision}; cpu node: fp32, 1 thread"
    )
    step_s: dict[str, list[float]] = {name: [] for name in places}
    rule = AggregatorConfig(name=config.aggregator, params=dict(config.aggregator_params))
    agreed = True
    deltas: dict[str, dict[str, torch.Tensor]] = {}
    for round_ in range(1, args.rounds + 1):
        wire = {}
        for name, place in places.items():
            torch.set_num_threads(threads[name])
            local = train_local(models[name], state[name], data, config, peer_id=f"{name}-node",
                                round_=round_, placement=place)  # fmt: skip
            if place.device.type == "cuda":
                torch.cuda.synchronize()
            step_s[name].append(local.seconds / config.local_steps)
            deltas[f"{name}-node"] = local.delta
            segments = flat_segments(local.delta)
            wire[f"{name}-node"] = (
                [encode_update_tensor(s, config.update_codec) for s in segments],
                [s.numel() for s in segments],
                {n: tuple(t.shape) for n, t in local.delta.items()},
            )
        cids = {}
        for name in places:  # each node on its own: decode, aggregate, outer step (CPU, f32)
            torch.set_num_threads(threads[name])
            updates = {
                peer: unflatten_segments(
                    [
                        decode_update_tensor(e, config.update_codec, (n,))
                        for e, n in zip(enc, ns, strict=True)
                    ],
                    shapes,
                )
                for peer, (enc, ns, shapes) in sorted(wire.items())
            }
            expected = _expected(state[name])
            result = aggregate(updates, expected=expected, config=rule)
            state[name], new_m = outer_step(state[name], momentum[name], result.tensors, config)
            assert new_m is not None
            momentum[name] = new_m
            cids[name] = state_cid(state[name])
        same_m = all(torch.equal(momentum["gpu"][k], momentum["cpu"][k]) for k in genesis)
        ok = cids["gpu"] == cids["cpu"] and same_m
        agreed = agreed and ok
        print(
            f"round {round_}: gpu {step_s['gpu'][-1]:.4f} s/step, cpu {step_s['cpu'][-1]:.4f} "
            f"s/step; state gpu {cids['gpu']} cpu {cids['cpu']} "
            f"{'SAME' if ok else 'DIFFERENT'} (momentum {'same' if same_m else 'DIFFERS'})"
        )
    torch.set_num_threads(threads["gpu"])
    losses = _loss_spread(state["cpu"], data, config, device, build_model)
    scores = _score_figures(state["cpu"], deltas, data, config, device, build_model)
    # Round 1 includes CUDA's warm-up (kernel selection, allocator): left out when there are more.
    gpu_s = statistics.median(step_s["gpu"][1:] or step_s["gpu"])
    cpu_s = statistics.median(step_s["cpu"][1:] or step_s["cpu"])
    figures: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "torch": torch.__version__,
        "parameters": params,
        "precision": args.precision,
        "gpu_s_per_step": gpu_s,
        "cpu_s_per_step": cpu_s,
        "cpu_over_gpu": cpu_s / gpu_s,
        "one_state_cid": agreed,
        "held_out_loss": losses,
        "scores": scores,
    }
    print(
        f"seconds per local step (median of rounds 2..{args.rounds}): gpu {gpu_s:.4f}, "
        f"cpu (1 thread) {cpu_s:.4f}; the GPU is {cpu_s / gpu_s:.1f}x the CPU node"
    )
    base = losses["cpu_float64"]
    print("held-out loss of the final state (difference to CPU float64, relative):")
    for how, value in losses.items():
        print(f"  {how:14s} {value:.8f}  {abs(value - base) / abs(base):.2e}")
    print("score losses (2 updates x 4 losses, SCORE_SEQUENCES each) against CPU float64:")
    for how, row in scores["arithmetic"].items():
        rel, dx, per = row["rel"], row["dx_units"], row["seconds_per_target"]
        print(f"  {how:16s} max rel loss error {rel:.2e}, max score error {dx:.4f} units, "
              f"{per:.4f} s per target")  # fmt: skip
    train_round = gpu_s * config.local_steps
    for how, took in scores["round_of_4"].items():
        what = (how if "2 targets" in how or how.startswith("part:")
                else f"a round of 4 updates as RoundScoring.score, {how}")  # fmt: skip
        print(f"  scoring {what}: {took:.3f} s = {took / train_round:.1%} of the gpu node's "
              f"local training ({train_round:.3f} s a round)")  # fmt: skip
    print(f"gpu_check: {'PASS: one state CID' if agreed else 'FAIL: the states differ'}")
    if device.type != "cuda":
        print("gpu_check: (ran with the GPU node on the CPU: a try-out, not the GPU check)")
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=1))
    return 0 if agreed else 1


def _expected(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    from cnode.aggregation import TensorSpec

    return {name: TensorSpec(tuple(t.shape), torch.float32) for name, t in state.items()}


def _loss_spread(
    state: dict[str, Any], data: Any, config: Any, device: Any, build_model: Any
) -> dict[str, float]:
    """The held-out loss of ``state`` in four arithmetics (what scorers on mixed hardware see)."""
    import torch

    from cnode.node.train.model import load_state

    batch = data.eval
    out = {}
    for how, where, dtype, autocast in (
        ("cpu_float64", "cpu", torch.float64, False),
        ("cpu_float32", "cpu", torch.float32, False),
        (f"{device.type}_float32", device, torch.float32, False),
        (f"{device.type}_bf16_mixed", device, torch.float32, True),
    ):
        model = build_model(config).to(dtype).eval()
        load_state(model, {k: t.to(dtype) for k, t in state.items()})
        torch.nn.Module.to(model, where)
        with (
            torch.no_grad(),
            torch.autocast(
                device_type=torch.device(where).type, dtype=torch.bfloat16, enabled=autocast
            ),
        ):
            x = batch.to(where)
            out[how] = float(model(input_ids=x, labels=x).loss)
    return out


def _score_figures(
    state: dict[str, Any],
    deltas: dict[str, dict[str, Any]],
    data: Any,
    config: Any,
    device: Any,
    build_model: Any,
) -> dict[str, Any]:
    """A score's four losses of each update in four arithmetics (scores/_settle.py's question)
    and the seconds per target, the same forward passes as RoundScoring.measure."""
    import torch

    from cnode.aggregation import draw_indices, score_seed
    from cnode.aggregation import limits as agg_limits
    from cnode.node.train.limits import SCORE_SEQUENCES
    from cnode.node.train.model import load_state

    seed = score_seed(["gpu-check"])
    n = SCORE_SEQUENCES
    held = data.eval[torch.tensor(draw_indices(seed, "held", len(data.eval), n))]
    batches = {}
    for peer in deltas:
        shard = data.shard(peer, 1, seed=config.seed)
        batches[peer] = [data.train[shard[draw_indices(seed, f"own:{peer}", len(shard), n)]], held]
    got: dict[str, dict[str, list[float]]] = {}
    seconds: dict[str, float] = {}
    for how, where, dtype, bf16 in (
        ("cpu_float64", "cpu", torch.float64, False),
        ("cpu_float32", "cpu", torch.float32, False),
        (f"{device.type}_float32", device, torch.float32, False),
        (f"{device.type}_bf16_mixed", device, torch.float32, True),
    ):
        model = build_model(config).to(dtype).eval()
        torch.nn.Module.to(model, where)
        got[how] = {}
        for rep in range(2):  # the first pass warms the device up; the second is timed
            began = time.perf_counter()
            for peer, delta in sorted(deltas.items()):
                base = {k: t.to(dtype) for k, t in state.items()}
                moved = {k: base[k] + agg_limits.SCORE_STEP * delta[k].to(dtype) for k in base}
                out = []
                for weights in (base, moved):
                    load_state(model, weights)
                    with (
                        torch.no_grad(),
                        torch.autocast(
                            torch.device(where).type, dtype=torch.bfloat16, enabled=bf16
                        ),
                    ):
                        out += [model(input_ids=b.to(where), labels=b.to(where)).loss
                                for b in batches[peer]]  # fmt: skip
                own_b, held_b, own_a, held_a = (float(v) for v in out)
                got[how][peer] = [own_b, own_a, held_b, held_a]
            seconds[how] = (time.perf_counter() - began) / len(deltas)
            del rep
    ref = got["cpu_float64"]
    round_of_4 = _round_of_4(state, deltas, data, config, device)

    def x(b: float, a: float) -> float:
        return (b - a) / b / agg_limits.SCORE_UNIT

    rows = {}
    for how, by_peer in got.items():
        rel = max(
            abs(v - r) / abs(r) for p in by_peer for v, r in zip(by_peer[p], ref[p], strict=True)
        )
        dx = max(
            abs(x(g[i], g[i + 1]) - x(r[i], r[i + 1]))
            for p in by_peer
            for g, r in [(by_peer[p], ref[p])]
            for i in (0, 2)
        )
        rows[how] = {"rel": rel, "dx_units": dx, "seconds_per_target": seconds[how]}
    return {"arithmetic": rows, "round_of_4": round_of_4}


def _round_of_4(
    state: dict[str, Any], deltas: dict[str, dict[str, Any]], data: Any, config: Any, device: Any
) -> dict[str, float]:
    """Seconds of scoring 4 updates with the node's code (scores/_settle.py's LossModels, the
    forward passes RoundScoring.score makes): fast on the device, and all in the reference."""
    import torch

    from cnode.aggregation import draw_indices, score_seed
    from cnode.node.train.limits import SCORE_SEQUENCES
    from cnode.node.train.model import Placement

    settle = importlib.import_module("cnode.node.train.scores._settle")
    seed = score_seed(["gpu-check-round"])
    n = SCORE_SEQUENCES
    held = data.eval[torch.tensor(draw_indices(seed, "held", len(data.eval), n))]
    updates = dict(zip((f"p{i}" for i in range(4)), [*deltas.values()] * 2, strict=True))
    own = {}
    for peer in updates:
        shard = data.shard(peer, 1, seed=config.seed)
        own[peer] = data.train[shard[draw_indices(seed, f"own:{peer}", len(shard), n)]]
    models = settle.LossModels(config, Placement(device))
    out = {}
    for how, losses in ((f"{device.type} float32 (fast)", models.fast),
                        ("cpu float64 (reference)", models.reference)):  # fmt: skip
        for _ in range(2):  # the first builds the model and warms the device up
            state = {k: t.clone() for k, t in state.items()}  # a new round's state: copied anew
            began = time.perf_counter()
            losses(state, None, [held, *own.values()])
            for peer, update in updates.items():
                losses(state, update, [own[peer], held])
            out[how] = time.perf_counter() - began

    # As before this change: the whole state copied to the device for every forward pass.
    def uncached(*args: Any) -> list[float]:
        models._parent_of = []
        return models.fast(*args)

    for _ in range(2):
        began = time.perf_counter()
        uncached(state, None, [held, *own.values()])
        for peer, update in updates.items():
            uncached(state, update, [own[peer], held])
        out[f"{device.type} float32, the state copied for every pass (before)"] = (
            time.perf_counter() - began
        )
    # A partitioned round's scorer (the default from PARTITION_MIN_MEMBERS members): its
    # SCORERS_PER_UPDATE targets one by one, as RoundScoring.measure takes them.
    for _ in range(2):
        state = {k: t.clone() for k, t in state.items()}
        began = time.perf_counter()
        for peer in list(updates)[:2]:
            models.fast(state, None, [own[peer], held])
            models.fast(state, updates[peer], [own[peer], held])
        out[f"{device.type} float32 (fast), 2 targets one by one (the path before)"] = (
            time.perf_counter() - began
        )
    # The same 2 targets as the node scores them now (RoundScoring.measure_targets' passes:
    # every "before" loss in one batched pass, then one pass per update), each update taken in
    # one staged copy (LossModels.stage_transfers, CUDA's default) and, for scale, per layer. The
    # passes, not the method: RoundScoring's module imports the record signing (libp2p).
    two = list(updates)[:2]
    for staged in (False, True):
        scorer = settle.LossModels(config, Placement(device), stage_transfers=staged)
        took = []
        for _ in range(8):  # the first builds the model and warms the device up
            state = {k: t.clone() for k, t in state.items()}  # a new round's: copied over anew
            began = time.perf_counter()
            scorer.fast(state, None, [held, *(own[p] for p in two)])
            for peer in two:
                scorer.fast(state, updates[peer], [own[peer], held])
            took.append(time.perf_counter() - began)
        how = "the state and each update in one staged copy" if staged else "copies per layer"
        what = f"2 targets as a partitioned round's scorer (measure_targets' passes), {how}"
        out[f"{device.type} float32 (fast), {what}, median of 7"] = statistics.median(took[1:])
    # Where a target's time goes: one update onto the device, one forward pass.
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    update = updates[two[0]]
    for staged in (False, True):
        scorer = settle.LossModels(config, Placement(device), stage_transfers=staged)
        scorer.fast(state, update, [held])
        sync()
        began = time.perf_counter()
        for _ in range(5):
            scorer._load_fast(state, update)
        sync()
        how = "one staged copy" if staged else "a copy per layer"
        out[f"part: one update onto the device and added to the state, {how}"] = (
            time.perf_counter() - began
        ) / 5
        began = time.perf_counter()
        for _ in range(5):
            scorer._parent_of = []  # as if a new round's state
            scorer._parent_on_device(state, [n for n, _ in scorer._params])
        sync()
        out[f"part: a round's state onto the device, {how}"] = (time.perf_counter() - began) / 5
    for rows in (32, 96):
        batch = [torch.cat([held] * (rows // held.shape[0]))]
        scorer.fast(state, None, batch)
        began = time.perf_counter()
        for _ in range(5):
            scorer.fast(state, None, batch)
        out[f"part: one scoring forward pass of {rows} sequences (and its loss read back)"] = (
            time.perf_counter() - began
        ) / 5
    return out


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING)
    try:
        import structlog

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    except ImportError:  # the skip path needs torch only
        pass
    sys.exit(main())
