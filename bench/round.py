"""Seconds and bytes per training round, full replication vs partitioned, vs a plain all-reduce.

N peers (``--peers``, default 4), each its own process, on loopback; each a real py-libp2p node
with a real BlockStore and a ``NodeTrainer``. The model is GPT-2-style, ~10.2M parameters (each
f32 update ~41 MB); above 8 peers, or with ``--small``, a ~1.7M-parameter one (the banner says
which). Per round, each cnode peer:

* train      one local AdamW step (batch 4 x 64 tokens) and the parameter delta;
* publish    store the delta (64 segments, one manifest layer each), sign the update header,
             put it on gossipsub;
* wait       (not this peer's work, reported apart) until every header has arrived (the
             slowest trainer), and at barriers between network and compute phases, so no peer
             serves blocks (GIL-bound, main thread) while another computes;

``--mode full`` (every peer fetches every update and aggregates everything):

* fetch      the other N-1 updates whole, every block verified against its CID;
* aggregate  scores of all N updates (training.scores), CenteredClip of the admitted, apply,
             state CID.

``--mode partitioned`` (parts = partition_count(N, SEGMENTS), aggregators =
assign_partitions("bench", round, sorted peer ids, parts)):

* fetch      this peer's partition's segments of the N-1 other updates (fetch_update_segments,
             from each update's author);
* scores     this peer's score targets (targets_of: 2 of the others), each update whole from its
             author, and their four losses (RoundScoring.measure); the records are not
             exchanged, so the partitions aggregate every input with scored_config();
* aggregate  CenteredClip of the partition (NodeTrainer.aggregate_partition), output stored,
             result signed and stored; its CID goes to the others as a file in the work dir
             (bench-only coordination, like the address files: the coordinator is left out);
* results    every other partition's signed result and output, from its aggregator;
* verify     ``--verify K`` partitions (default node/train/limits.VERIFY_PARTITIONS) chosen by
             verification_choice(sha256 of the sorted result CIDs, me, parts, K, own excluded):
             their inputs fetched and the partition recomputed; the output CID must match;
* assemble   NodeTrainer.apply_partitions: the new state from every output, state CID.

Printed per (mode, codec) swarm: the median over peers and rounds (the first round left out when
rounds > 1) of each phase, and of the peer process's CPU seconds in it (all threads: steadier than
wall time when other work shares the machine); bytes received per peer per round / update size,
split into exchange (inputs + results) and verification; whether every peer ends on one state CID.
The baseline runs in the same invocation: N processes with torch.distributed (gloo, loopback), the
same model and step, ``all_reduce(delta) / N`` and apply. ``overhead_s`` = publish + fetch +
scores + aggregate + results + verify + assemble (the medians): what a round costs beyond
training and waiting for the slowest trainer; compared with the all-reduce. No coordinator is
involved.
Where a venv has hivemind 1.1.12 (``CNODE_BENCH_HIVEMIND_PYTHON`` or /opt/hivemind-venv, never a
cnode dependency), its all-reduce of the same float32 model runs too (bench/_hivemind_allreduce.py:
N processes, DecentralizedAverager, matchmaking done before the timed trigger) and each swarm's
overhead is compared with it. Bytes in per peer are also given as a ratio to an f32 update
(``in_vs_f32``: exchange + verification + scores, everything a peer receives but headers).
Scores are on, as in a default run: in full mode ``aggregate`` scores every update (they are all
held); in partitioned mode each peer fetches its score targets whole and measures their losses.

``--json`` ends the output with ONE JSON line. One swarm: ``{"peers", "mode", "codec", "params",
"update_bytes", "bytes_in_per_peer", "bytes_in_ratio", "verify_bytes_per_peer", "verify_ratio",
"overhead_s", "allreduce_s", "overhead_vs_allreduce", "bytes_in_vs_f32", "hivemind_s",
"overhead_vs_hivemind", "phases": {phase: s}, "cpu": {phase: CPU s}, "states"}``
(``allreduce_s`` and the ratio null with ``--no-baseline``; ``states``: distinct final state
CIDs, 1 when the peers agree). Several swarms: ``{"peers", "params", "allreduce_s", "runs":
[one object as above per swarm]}``.

    .venv/bin/python bench/round.py                          # 4 peers, both modes and codecs
    .venv/bin/python bench/round.py --peers 8 --mode partitioned --codec f32 --json
    .venv/bin/python bench/round.py --peers 16 --mode full partitioned --verify 0
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _hivemind_allreduce import measure as hivemind_allreduce
from _round_peers import allreduce_peer, cnode_peer

# n_layer=6, n_embd=368 (4 heads), vocab 1024, 64 positions: 10,152,000 parameters (+ LayerNorms).
TRAINING = {
    "model": {"n_layer": 6, "n_embd": 368, "n_head": 4, "n_positions": 64},
    "local_steps": 1,
    "batch_size": 4,
    "data": {"eval_sequences": 8},
    "scores": True,  # as in a default run (TrainingConfig.for_run)
}
# For many peers on a small machine: n_layer=3, n_embd=192.
SMALL = {**TRAINING, "model": {"n_layer": 3, "n_embd": 192, "n_head": 4, "n_positions": 64}}
PHASES = (
    "train", "publish", "wait", "fetch", "scores", "aggregate", "results", "verify", "assemble"
)  # fmt: skip
OVERHEAD = ("publish", "fetch", "scores", "aggregate", "results", "verify", "assemble")
# Process CPU per phase (train and publish share one worker-thread call: measured together).
CPU = (
    "train_publish",
    "fetch",
    "scores",
    "aggregate",
    "results",
    "verify_fetch",
    "verify_compute",
    "assemble",
)
JOIN_S = 1200  # the longest a swarm may take before its processes are killed


def _run(target: Any, n: int, args_of: Any) -> list[list[dict[str, Any]]]:
    """Start ``n`` processes of ``target``; their JSON outputs. Every process is stopped."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="cnode-bench-round-") as tmp:
        outs = [str(Path(tmp) / f"out{i}.json") for i in range(n)]
        procs = [ctx.Process(target=target, args=args_of(i, tmp, outs[i])) for i in range(n)]
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + JOIN_S
            while any(p.exitcode is None for p in procs):  # fail fast: one dies, all stop
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    why = f"exit {failed[0]}" if failed else f"over {JOIN_S} s"
                    raise SystemExit(f"a peer process failed ({why}; -9: killed, often OOM)")
                time.sleep(0.2)
            if any(p.exitcode != 0 for p in procs):
                raise SystemExit("a peer process failed")
            return [json.loads(Path(o).read_text()) for o in outs]
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)


def _median(results: list[list[dict[str, Any]]], key: str, skip_first: bool) -> float:
    values = [r.get(key, 0.0) for peer in results for r in peer[1 if skip_first else 0 :]]
    return float(statistics.median(values))


def _report_cnode(
    mode: str, codec: str, cnode: list[list[dict[str, Any]]], skip: bool, n: int, params: int
) -> dict[str, Any]:
    phases = {k: _median(cnode, k, skip) for k in (*PHASES, "round")}
    cpu_note = ", first round left out" if skip else ""
    print(
        f"\n{mode}, update_codec = {codec!r}, {n} peers (median over peers and rounds"
        f"{cpu_note}), seconds:"
    )
    for key, value in phases.items():
        print(f"  {key:<10} {value:8.3f}")
        if key == "verify" and value:
            parts = {k: _median(cnode, f"verify_{k}", skip) for k in ("fetch", "compute")}
            print("             (" + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) + ")")
    cpu = {k: _median(cnode, f"cpu_{k}", skip) for k in CPU}
    print(
        "  CPU s (the peer's process, all threads; steadier than wall on a shared machine): "
        + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items() if v)
    )
    update = _median(cnode, "update_bytes", False)
    fetched = _median(cnode, "fetched_bytes", skip)
    verify = _median(cnode, "verify_bytes", skip)
    scored = _median(cnode, "score_bytes", skip)
    states = {r["state"] for peer in cnode for r in peer[-1:]}
    overhead = sum(phases[k] for k in OVERHEAD)
    print(
        f"  update: {update / 1e6:.2f} MB (all its blocks); received per peer per round: "
        f"exchange {fetched / 1e6:.2f} MB = {fetched / update:.2f}x the update, "
        f"verification {verify / 1e6:.2f} MB = {verify / update:.2f}x, "
        f"scores {scored / 1e6:.2f} MB = {scored / update:.2f}x"
    )
    f32 = 4 * params
    print(
        f"  received per peer per round, vs an f32 update ({f32 / 1e6:.2f} MB): exchange "
        f"{fetched / f32:.4f}x, verification {verify / f32:.4f}x, scores {scored / f32:.4f}x, "
        f"all {(fetched + verify + scored) / f32:.4f}x"
    )
    print(f"  overhead_s (publish+fetch+scores+aggregate+results+verify+assemble): {overhead:.3f}")
    print(f"  every peer ends on one state: {len(states) == 1} ({', '.join(sorted(states))[:120]})")
    retries = sum(r.get("retries", 0) for peer in cnode for r in peer)
    print(f"  fetches retried (a holder starved past NO_PROGRESS_TIMEOUT_S): {retries}")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return {
        "peers": n,
        "mode": mode,
        "codec": codec,
        "update_bytes": int(update),
        "bytes_in_per_peer": int(fetched),
        "bytes_in_ratio": round(fetched / update, 4),
        "verify_bytes_per_peer": int(verify),
        "verify_ratio": round(verify / update, 4),
        "score_bytes_per_peer": int(scored),
        "bytes_in_vs_f32": round((fetched + verify + scored) / f32, 5),
        "overhead_s": round(overhead, 4),
        "phases": {k: round(v, 4) for k, v in phases.items()},
        "cpu": {k: round(v, 4) for k, v in cpu.items()},
        "states": len(states),
        "retries": retries,
    }


def _parse() -> argparse.Namespace:
    from cnode.aggregation import CODECS
    from cnode.node.train import limits

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--peers", type=int, default=4, help="peer processes (default 4)")
    parser.add_argument(
        "--mode", nargs="+", choices=("full", "partitioned"), default=["full", "partitioned"]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--codec",
        nargs="+",
        choices=CODECS,
        default=["f32", "int8-blockwise"],
        help="the run's update_codec; several: one swarm each, compared",
    )
    parser.add_argument(
        "--verify",
        type=int,
        default=limits.VERIFY_PARTITIONS,
        help="partitions each peer recomputes per round (partitioned mode; 0 allowed)",
    )
    parser.add_argument("--small", action="store_true", help="the small model (auto above 8)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the gloo all-reduce")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    if args.peers < 2 or args.rounds < 1 or args.verify < 0:
        parser.error("--peers >= 2, --rounds >= 1, --verify >= 0")
    return args


def main() -> None:
    args = _parse()
    from cnode.node.train import TrainingConfig, build_model, model_state

    n = args.peers
    training = SMALL if args.small or n > 8 else TRAINING
    model = TrainingConfig.from_dict(training).model
    params = sum(
        t.numel() for t in model_state(build_model(TrainingConfig.from_dict(training))).values()
    )
    print(
        f"bench/round.py: {n} peers on loopback, model n_layer={model.n_layer} "
        f"n_embd={model.n_embd}: {params:,} parameters ({params * 4 / 1e6:.1f} MB per f32 "
        f"update), {args.rounds} rounds, {os.cpu_count()} CPUs, modes {', '.join(args.mode)}, "
        f"codecs {', '.join(args.codec)}, verify {args.verify}"
    )
    skip = args.rounds > 1  # the first round includes warm-up (allocations, first connections)
    base_spec = {"peers": n, "rounds": args.rounds, "training": training, "verify": args.verify}
    runs: list[dict[str, Any]] = []
    for mode in args.mode:
        for codec in args.codec:
            spec = {**base_spec, "mode": mode, "codec": codec}
            cnode = _run(cnode_peer, n, lambda i, tmp, out, s=spec: (i, s, tmp, out))
            runs.append({**_report_cnode(mode, codec, cnode, skip, n, params), "params": params})
            sys.stdout.flush()
    allreduce: float | None = None
    if not args.no_baseline:
        base = _run(
            allreduce_peer, n, lambda i, tmp, out: (i, base_spec, f"file://{tmp}/rendezvous", out)
        )
        b_rows = [(k, _median(base, k, skip)) for k in ("train", "wait", "allreduce", "round")]
        print(f"\nall-reduce baseline (gloo, {n} processes, same model and step, f32), seconds:")
        for key, value in b_rows:
            print(f"  {key:<10} {value:8.3f}")
        allreduce = dict(b_rows)["allreduce"]
    hivemind = None if args.no_baseline else hivemind_allreduce(n, params)
    if hivemind is not None:
        print(
            f"\nhivemind 1.1.12 all-reduce (DecentralizedAverager, {n} processes, the same "
            f"float32 model, matchmaking excluded): median {hivemind[0]:.3f} s, max "
            f"{hivemind[1]:.3f} s"
        )
    print(f"\nsummary, {n} peers, {params:,} parameters:")
    print(
        "  mode         codec          bytes_in  verify  in_vs_f32  overhead_s  allreduce_s  ratio"
    )
    for run in runs:
        run["allreduce_s"] = None if allreduce is None else round(allreduce, 4)
        ratio = None if not allreduce else run["overhead_s"] / allreduce
        run["overhead_vs_allreduce"] = None if ratio is None else round(ratio, 3)
        run["hivemind_s"] = None if hivemind is None else round(hivemind[0], 4)
        run["overhead_vs_hivemind"] = (
            None if hivemind is None else round(run["overhead_s"] / hivemind[0], 3)
        )
        print(
            f"  {run['mode']:<12} {run['codec']:<14} {run['bytes_in_ratio']:7.2f}x "
            f"{run['verify_ratio']:6.2f}x {run['bytes_in_vs_f32']:9.4f}x "
            f"{run['overhead_s']:10.3f}  "
            f"{allreduce or float('nan'):10.3f}  {ratio or float('nan'):5.2f}x"
            + (f"  vs hivemind {run['overhead_vs_hivemind']:.2f}x" if hivemind else "")
        )
    if args.json:
        if len(runs) == 1:
            print(json.dumps(runs[0]))
        else:
            print(
                json.dumps(
                    {
                        "peers": n,
                        "params": params,
                        "allreduce_s": runs[0]["allreduce_s"],
                        "runs": runs,
                    }
                )
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
