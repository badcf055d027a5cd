"""Seconds and bytes per round of real `cnode train` nodes, vs all-reduce of the same model.

For each (mode, codec): a coordinator and ``--peers`` ``cnode train`` processes on 127.0.0.1
(homes made with ``cnode init``, one checkpointer), the node's own round code end to end: a
GPT-2-style model of ~10.2M parameters (``--small``: ~1.7M; each f32 update 4 bytes a value),
one local step a round, scores on as in a default run, ``training.partitioned = "always"``
(``--mode partitioned``) or ``"never"`` (``--mode full``). Nothing of the round is re-implemented
here: the figures are the nodes' own round reports (specs/training.md#partitioned-rounds, the
round event):

* overhead   per node and round, ``assembled_at`` minus the latest ``published_at`` of the
             round's members: from the last update published to this node's assembled state
             (fetching, scoring, aggregating, results, verification, assembly and every wait);
* phases     partitioned rounds: the node's stages (``phases``: aggregate, scores_wait,
             results_wait, results, verify, agreed_wait, assemble; and scores, concurrent with
             aggregate); full rounds: fetch and aggregate;
* bytes in   verified bytes each node fetched (``bytes_in_by``: exchange = partition inputs and
             outputs, verify, scores = whole score targets), per round, as a ratio to one f32
             update of the model: everything a node receives but headers and small envelopes.

Medians over nodes and rounds, the first round left out when ``--rounds`` > 1 (warm-up). The
baselines run in the same invocation: the gloo all-reduce of the same float32 model
(bench/_allreduce.py, ``--no-baseline`` skips it and hivemind) and, where a venv has hivemind
1.1.12 (``CNODE_BENCH_HIVEMIND_PYTHON`` or /opt/hivemind-venv, never a cnode dependency), its
all-reduce (bench/_hivemind_allreduce.py: N processes, DecentralizedAverager, matchmaking done
before the timed trigger). ``--json`` ends with one JSON line: ``{"peers", "params",
"allreduce_s", "hivemind_s", "runs": [{"mode", "codec", "overhead_s", "overhead_vs_allreduce",
"overhead_vs_hivemind", "phases", "bytes_in_vs_f32": {"exchange", "verify", "scores", "all"},
"states", "rounds_done", "broken"}]}``.

    .venv/bin/python bench/round.py --peers 4 --mode partitioned --codec sparse-topk
    .venv/bin/python bench/round.py --peers 8 --small --codec sparse-topk --no-baseline --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from _allreduce import gloo_allreduce  # bench/ is the script's folder
from _hivemind_allreduce import measure as hivemind_allreduce
from _homes import (  # bench/ is the script's folder
    init_homes,
    report_events,
    start_coordinator,
    start_nodes,
    stop_all,
    wait_all,
)

RUN = "bench-round"
# n_layer=6, n_embd=368 (4 heads), vocab 1024, 64 positions: 10,180,352 parameters.
TRAINING: dict[str, Any] = {
    "model": {"n_layer": 6, "n_embd": 368, "n_head": 4, "n_positions": 64},
    "local_steps": 1,
    "batch_size": 4,
    "data": {"eval_sequences": 8},
    "scores": True,  # as in a default run (TrainingConfig.for_run)
}
SMALL = {**TRAINING, "model": {"n_layer": 3, "n_embd": 192, "n_head": 4, "n_positions": 64}}
PHASES = ("aggregate", "scores", "scores_fetch", "scores_compute", "scores_wait", "results_wait",
          "results", "verify", "agreed_wait", "assemble")  # fmt: skip
KINDS = ("exchange", "verify", "scores")


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def _swarm(n: int, rounds: int, training: dict[str, Any], timeout_s: float) -> dict[Path, list]:
    """Run one swarm to its end; each home's round events."""
    with TemporaryDirectory(prefix=f"cnode-bench-round{n}-") as tmp:
        work = Path(tmp)
        homes = [work / f"node-{i:02d}" for i in range(n)]
        peers = init_homes(homes)
        coordinator = start_coordinator(work, RUN, peers, training, collect_timeout_s=300.0)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            procs = start_nodes(homes, RUN, work / "run.toml", coordinator.url, rounds)
            wait_all(procs, timeout_s)
        finally:
            stop_all(procs)
            coordinator.stop()
        return {home: report_events(home, "round") for home in homes}


def _figures(events: dict[Path, list], rounds: int, f32_bytes: int) -> dict[str, Any]:
    """The run's medians from the nodes' round events (see the module docstring)."""
    skip = 1 if rounds > 1 else 0
    rows = [e for evs in events.values() for e in evs if e["round"] > skip]
    last_published: dict[int, float] = {}
    for e in (e for evs in events.values() for e in evs):
        last_published[e["round"]] = max(last_published.get(e["round"], 0.0), e["published_at"])
    overhead = _median([e["assembled_at"] - last_published[e["round"]] for e in rows])
    phases = {
        k: _median([e["phases"][k] for e in rows if k in e.get("phases", {})]) for k in PHASES
    }
    phases.update({k: _median([e[k] for e in rows if e.get("parts") == 0]) for k in
                   ("fetch_s", "aggregate_s")})  # fmt: skip
    phases["train_s"] = _median([e["train_s"] for e in rows])
    by_kind = {
        k: _median([e.get("bytes_in_by", {}).get(k, 0) / f32_bytes for e in rows]) for k in KINDS
    }
    if not any(e.get("bytes_in_by") for e in rows):  # full rounds: no split, all is exchange
        by_kind["exchange"] = _median([e["bytes_in"] / f32_bytes for e in rows])
    finals = {evs[-1]["state_cid"] for evs in events.values() if evs and evs[-1]["round"] == rounds}
    done = min((evs[-1]["round"] if evs else 0) for evs in events.values())
    return {
        "overhead_s": overhead,
        "phases": {k: v for k, v in phases.items() if v is not None},
        "bytes_in_vs_f32": {
            **by_kind,
            "all": _median([e["bytes_in"] / f32_bytes for e in rows]),
        },
        "states": len(finals),
        "rounds_done": done,
        "broken": done < rounds,
    }


def _parse() -> argparse.Namespace:
    from cnode.aggregation import CODECS

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--peers", type=int, default=4, help="cnode train processes (default 4)")
    parser.add_argument(
        "--mode", nargs="+", choices=("full", "partitioned"), default=["partitioned"]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--codec", nargs="+", choices=CODECS, default=["sparse-topk", "int8-blockwise"],
        help="the run's update_codec; several: one swarm each, compared",
    )  # fmt: skip
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=JSON",
                        help="more [training] keys, e.g. error_decay=0.95")  # fmt: skip
    parser.add_argument("--small", action="store_true", help="the ~1.7M-parameter model")
    parser.add_argument("--no-baseline", action="store_true", help="skip gloo and hivemind")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per swarm")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    if args.peers < 2 or args.rounds < 1:
        parser.error("--peers >= 2, --rounds >= 1")
    return args


def main() -> int:
    args = _parse()
    from cnode.node.train import TrainingConfig, build_model, model_state

    base = SMALL if args.small else TRAINING
    extra = {k: json.loads(v) for k, _, v in (item.partition("=") for item in args.set)}
    params = sum(
        t.numel() for t in model_state(build_model(TrainingConfig.from_dict(base))).values()
    )
    n, f32 = args.peers, 4 * params
    print(
        f"bench/round.py: {n} cnode train nodes on loopback, {params:,} parameters "
        f"({f32 / 1e6:.2f} MB per f32 update), {args.rounds} rounds, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs = []
    for mode in args.mode:
        for codec in args.codec:
            partitioned = "always" if mode == "partitioned" else "never"
            training = {**base, "update_codec": codec, "partitioned": partitioned, **extra}
            events = _swarm(n, args.rounds, training, args.timeout_s)
            run = {"mode": mode, "codec": codec, **_figures(events, args.rounds, f32)}
            runs.append(run)
            print(f"\n{mode}, {codec}: {json.dumps(run)}", flush=True)
    allreduce = hivemind = None
    if not args.no_baseline:
        allreduce = round(gloo_allreduce(n, args.rounds, base), 4)
        got = hivemind_allreduce(n, params)
        hivemind = None if got is None else got[0]
    print(f"\nall-reduce of the same float32 model, {n} processes: gloo {allreduce} s, "
          f"hivemind 1.1.12 {hivemind} s (median)")  # fmt: skip
    print("\nmode         codec           overhead_s  vs gloo  vs hivemind  bytes in per peer per "
          "round vs f32: exchange verify scores all  states")  # fmt: skip
    for run in runs:
        over = run["overhead_s"]
        run["overhead_vs_allreduce"] = round(over / allreduce, 2) if over and allreduce else None
        run["overhead_vs_hivemind"] = round(over / hivemind, 2) if over and hivemind else None
        b = run["bytes_in_vs_f32"]
        print(f"{run['mode']:<12} {run['codec']:<15} {over!s:>10}  "
              f"{run['overhead_vs_allreduce']!s:>7}  {run['overhead_vs_hivemind']!s:>11}  "
              f"{b['exchange']} {b['verify']} {b['scores']} {b['all']}  {run['states']}"
              + ("  BROKEN" if run["broken"] else ""))  # fmt: skip
    if args.json:
        out = {"peers": n, "params": params, "allreduce_s": allreduce, "hivemind_s": hivemind}
        print(json.dumps({**out, "runs": runs}))
    sys.stdout.flush()
    return 1 if any(r["broken"] or r["states"] != 1 for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
