"""A round on capped home links: cnode's nodes against hivemind's all-reduce, same caps, same run.

For each cap in ``--mbit`` (default 50 and 20): ../shared/tools/netbed.sh builds ``--peers``
network namespaces whose links are capped at that many Mbit/s up and down (a home link); the
coordinator runs on host 0 and one ``cnode train`` on each host (node 0 the checkpointer), the
node's own code end to end: bench/round.py's 10.2M-parameter model (``--small``: its ~1.7M one),
one local step a round, scores on, partitioned rounds, and the codec a new run gets
(``cnode coordinator new-run``'s default; ``--codec`` to choose). The figures are the nodes' round
events, read as bench/round.py reads them (medians over nodes and rounds, the first round left
out): per phase, seconds (``aggregate`` = exchange of the node's partition inputs and its
aggregation, ``scores_fetch``, ``scores_compute``, ``results``, ``verify``, ...) and bytes in per
peer per round (exchange, verify, scores) against one f32 update of the model. The round's time
outside training and scoring compute is each node's overhead (its state assembled minus the
round's last update published) less its own ``scores_compute``: on a CPU-only machine scoring is
CPU-bound, and the GPU check covers it (bench/gpu_check.py).

The baseline, in the same run on the same testbed: hivemind 1.1.12's all-reduce of the same
float32 model (bench/_hivemind_allreduce.py ``--netns``: peer i on host i), where a venv has
hivemind (``CNODE_BENCH_HIVEMIND_PYTHON`` or /opt/hivemind-venv; never a cnode dependency). The
ratio printed is cnode's time outside training and scoring compute over hivemind's all-reduce.

Needs root, iproute2 and ../shared beside the checkout. Holds the testbed for the whole run.

    .venv/bin/python bench/capped_round.py                         # 4 x 10.2M at 50 and 20 Mbit/s
    .venv/bin/python bench/capped_round.py --peers 8 --small --mbit 50 --no-hivemind
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

import tomli_w
from _hivemind_allreduce import measure as hivemind_allreduce  # bench/ is the script's folder
from _homes import init_homes, report_events, run_config, stop_all, wait_all
from round import SMALL, TRAINING, _figures

from cnode.auth import Identity, save_identity
from cnode.node.coordinator.server import CoordinatorProcess

NETBED = Path(__file__).resolve().parents[2] / "shared" / "tools" / "netbed.sh"
RUN = "bench-capped"
PORT = 8470


def _addr(i: int) -> str:
    return f"10.77.0.{10 + i}"


def _netbed(*args: str) -> None:
    subprocess.run(["bash", str(NETBED), *args], check=True, capture_output=True, timeout=180)


def _swarm(
    n: int, rounds: int, training: dict[str, Any], timeout_s: float, keep: Path | None
) -> dict[Path, list]:
    """One swarm on the testbed (already up) to its end; each home's round events. ``keep``:
    its homes and logs go there (a new folder) instead of a temporary one."""
    with TemporaryDirectory(prefix=f"cnode-bench-capped{n}-") as tmp:
        work = Path(tmp) if keep is None else keep
        work.mkdir(parents=True, exist_ok=True)
        homes = [work / f"node-{i:02d}" for i in range(n)]
        peers = init_homes(homes)
        key = Identity.generate()
        save_identity(key, work / "coordinator.key")
        config = run_config(RUN, key.peer_id_str, peers, training, collect_timeout_s=300.0)
        config["url"] = f"http://{_addr(0)}:{PORT}"
        (work / "run.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
        coordinator = CoordinatorProcess(
            work / "run.toml", work / "coordinator.db", work / "coordinator.key",
            listen=f"{_addr(0)}:{PORT}", p2p_listen=f"/ip4/{_addr(0)}/tcp/0",
            wrap=("ip", "netns", "exec", "cb0"),
        ).start()  # fmt: skip
        procs: list[subprocess.Popen[bytes]] = []
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            for i, home in enumerate(homes):
                cmd = [
                    "ip", "netns", "exec", f"cb{i}", sys.executable, "-m", "cnode", "--log-json",
                    "train", "--run", RUN, "--run-config", str(work / "run.toml"),
                    "--home", str(home), "--coordinator", config["url"],
                    "--rounds", str(rounds), "--report", str(home / "report.jsonl"),
                ] + (["--checkpointer"] if i == 0 else [])  # fmt: skip
                with (home / "node.log").open("ab") as log:
                    procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log))
            wait_all(procs, timeout_s)
        finally:
            stop_all(procs)
            coordinator.stop()
        return {home: report_events(home, "round") for home in homes}


def _outside(events: dict[Path, list], rounds: int) -> tuple[float | None, float | None]:
    """Medians over nodes and rounds (the first left out) of the overhead less scoring compute:
    less the node's own ``scores_compute``, and less the round's slowest (the agreed scores wait
    for every member's record, so the slowest scorer is on every node's path)."""
    skip = 1 if rounds > 1 else 0
    last: dict[int, float] = {}
    slowest: dict[int, float] = {}
    for e in (e for evs in events.values() for e in evs):
        r, compute = e["round"], e.get("phases", {}).get("scores_compute", 0.0)
        last[r] = max(last.get(r, 0.0), e["published_at"])
        slowest[r] = max(slowest.get(r, 0.0), compute)
    rows = [e for evs in events.values() for e in evs if e["round"] > skip]
    own = [
        e["assembled_at"] - last[e["round"]] - e.get("phases", {}).get("scores_compute", 0.0)
        for e in rows
    ]
    worst = [e["assembled_at"] - last[e["round"]] - slowest[e["round"]] for e in rows]
    return (
        round(statistics.median(own), 4) if own else None,
        round(statistics.median(worst), 4) if worst else None,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--mbit", type=int, nargs="+", default=[50, 20], help="link caps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codec", help="training.update_codec (default: a new run's)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=JSON")
    parser.add_argument("--small", action="store_true", help="the ~1.7M-parameter model")
    parser.add_argument("--no-hivemind", action="store_true", help="skip the baseline")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per swarm")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--keep", type=Path, help="keep the homes and logs under this folder")
    args = parser.parse_args()
    from cnode.node import new_run_training
    from cnode.node.train import TrainingConfig, build_model, model_state

    base = SMALL if args.small else TRAINING
    extra = {k: json.loads(v) for k, _, v in (item.partition("=") for item in args.set)}
    codec_keys = new_run_training() if args.codec is None else {"update_codec": args.codec}
    training = {**base, **codec_keys, "partitioned": "always", **extra}
    params = sum(
        t.numel()
        for t in model_state(build_model(TrainingConfig.from_dict({**base, **extra}))).values()
    )
    n, f32 = args.peers, 4 * params
    print(f"bench/capped_round.py: {n} cnode train nodes, {params:,} parameters ({f32 / 1e6:.2f} "
          f"MB per f32 update), {args.rounds} rounds, training keys {codec_keys}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    runs = []
    failed = False
    for mbit in args.mbit:
        subprocess.run(["bash", str(NETBED), "down"], capture_output=True, timeout=60)
        _netbed("up", str(n), str(mbit), "0", str(mbit))
        try:
            keep = None if args.keep is None else args.keep / f"{mbit}mbit"
            events = _swarm(n, args.rounds, training, args.timeout_s, keep)
            run = {"mbit": mbit, **_figures(events, args.rounds, f32)}
            run["outside_s"], run["outside_slowest_s"] = _outside(events, args.rounds)
            got = None if args.no_hivemind else hivemind_allreduce(n, params, netns=True)
            run["hivemind_s"] = None if got is None else got[0]
        finally:
            subprocess.run(["bash", str(NETBED), "down"], capture_output=True, timeout=60)
        if run["outside_s"] and run["hivemind_s"]:
            run["outside_vs_hivemind"] = round(run["outside_s"] / run["hivemind_s"], 3)
            run["outside_slowest_vs_hivemind"] = round(
                run["outside_slowest_s"] / run["hivemind_s"], 3
            )
        failed |= run["broken"] or run["states"] != 1
        runs.append(run)
        print(f"\n{mbit} Mbit/s: {json.dumps(run)}", flush=True)
    print("\nMbit/s  overhead_s  scores_compute_s  outside_s (own / slowest)  hivemind_s  ratios"
          "  bytes in per peer per round vs f32: exchange verify scores all  states")  # fmt: skip
    for r in runs:
        b, ph = r["bytes_in_vs_f32"], r["phases"]
        print(f"{r['mbit']:>6}  {r['overhead_s']!s:>10}  {ph.get('scores_compute')!s:>16}  "
              f"{r['outside_s']!s:>9} / {r['outside_slowest_s']!s:>9}  {r['hivemind_s']!s:>10}  "
              f"{r.get('outside_vs_hivemind')!s} / {r.get('outside_slowest_vs_hivemind')!s}  "
              f"{b['exchange']} {b['verify']} {b['scores']} "
              f"{b['all']}  {r['states']}" + ("  BROKEN" if r["broken"] else ""))  # fmt: skip
    if args.json:
        print(json.dumps({"peers": n, "params": params, "training": codec_keys, "runs": runs}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
