"""How a real swarm scales in members on one machine (issue 27): 4, 8, 16, 32 `cnode train`s.

For each size *n*: a coordinator and *n* ``cnode train`` processes on 127.0.0.1 (homes made
with ``cnode init``; one checkpointer), a ~1.4M-parameter model, one local step a round, the
update codec a new run gets (``cnode.node.new_run_training``: sparse-topk; ``--codec f32`` for
the figures measured before issue 38), the run's defaults otherwise (partitioned from 3
members, scores on). It plays
``--rounds`` rounds and prints, per size:

- seconds per round (the median gap between rounds, from the nodes' reports) and the median of
  each node-reported phase (train, publish, fetch, aggregate);
- one member's CPU seconds per round (its process, every thread: the round event's ``cpu_s``,
  median over rounds 2 on), beside seconds per round, each as a ratio to the smallest size: on
  one machine a round takes the members' summed CPU over the cores, so seconds per round grow as
  n times what one member costs, and the member's cost is the figure that carries to one member
  per machine;
- with ``--count-gossip``, what each node's gossipsub router sent per round (RPCs, kB, messages
  by topic, control entries; ``bench/gossip_probe``);
- verified bytes in per peer per round (the median of every node's ``bytes_in``: the update
  bytes the aggregation needs), and its ratio to the smallest size in the same run (the
  baseline: flat in *n* is the goal); and every block byte in (``blocks_in``: those bytes plus
  the manifest roots and signed records that name them, what a member's link carries), with
  its ratio too;
- the coordinator's HTTP requests per round and CPU seconds per round (its ``/metrics``);
- whether every node ended on one state CID;
- the machine's idle CPU (``/proc/stat``, sampled every IDLE_SAMPLE_S) in each phase of each
  round, beside the phase's seconds: *train* (from the round's start, the last state assembled
  the round before, to the first member's publish) and *exchange* (from the first publish to
  the last assembled state: the window issue 41 judges, where an idle CPU means the exchange
  waits on itself); both over the whole run too;
- the block requests each node made per round, by purpose and level (``exchange_totals``
  ``by_purpose``: segments, scores, outputs, relay, ...; root, manifest nodes, chunks), with
  the blocks and kB each asked for (issue 41: fewer, larger requests per member);
- from the nodes' logs: ``holder_dropped`` by kind, ``request_stalled``, the admissions each
  holder answered per requester per round (at most one per connection per round is the goal),
  and the exchange's own figures (``exchange_totals``: time to first byte, a request's wait at
  its holder, throughput).

A size whose swarm does not finish in ``--timeout-s`` is reported as broken, with where it was.
Every process is stopped at the end of its size. ``python bench/swarm_size.py --sizes 4,8,16``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from _homes import (  # bench/ is the script's folder
    init_homes,
    report_events,
    start_coordinator,
    start_nodes,
    stop_all,
    wait_all,
)

from cnode.node import new_run_training

RUN = "scale"
MODEL = {"n_layer": 4, "n_embd": 160, "n_head": 4}  # ~1.4M parameters with the 1024-token vocab


def _metrics(url: str) -> tuple[dict[str, float], float]:
    """(HTTP requests answered by route and status, CPU seconds) from the coordinator's
    /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    requests: dict[str, float] = {}
    for m in re.finditer(r"^cnode_coordinator_requests_total\{(.*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = f"{labels.get('route', '?')} {labels.get('status', '?')}"
        requests[key] = requests.get(key, 0.0) + float(m.group(2))
    cpu = re.search(r"^process_cpu_seconds_total (\S+)$", text, re.M)
    return requests, float(cpu.group(1)) if cpu else float("nan")


IDLE_SAMPLE_S = 0.5


def _cpu_times() -> tuple[float, float]:
    """(idle, total) jiffies of the whole machine so far (iowait counts as idle)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])


class IdleSampler:
    """The machine's idle CPU fraction over each IDLE_SAMPLE_S, with the wall time it ended."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (wall end, idle fraction)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> IdleSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        idle, total = _cpu_times()
        while not self._stop.wait(IDLE_SAMPLE_S):
            idle2, total2 = _cpu_times()
            if total2 > total:
                self.samples.append((time.time(), (idle2 - idle) / (total2 - total)))
            idle, total = idle2, total2

    def idle(self, start: float, end: float) -> float | None:
        """Mean idle fraction of the samples ending in (start, end]; None if none did."""
        got = [f for t, f in self.samples if start < t <= end]
        return round(statistics.mean(got), 3) if got else None


def _log_events(home: Path, names: set[str]) -> list[dict[str, Any]]:
    """The node's JSON log lines whose event is one of ``names``."""
    out: list[dict[str, Any]] = []
    log = home / "node.log"
    if not log.exists():
        return out
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") in names:
            out.append(e)
    return out


def _exchange_counts(nodes: list[tuple[Path, str]], played: int) -> dict[str, Any]:
    """What the nodes' logs say of the block exchange (issue 41's counts)."""
    dropped: dict[str, int] = {}
    stalls = 0
    slow_kept = 0
    per_pair: dict[tuple[str, str], int] = {}
    totals: list[dict[str, Any]] = []
    for home, _peer in nodes:
        names = {"holder_dropped", "request_stalled", "holder_slow_kept", "admitted"}
        events = _log_events(home, names | {"exchange_totals"})
        for e in events:
            kind = e["event"]
            if kind == "holder_dropped":
                why = str(e.get("kind") or str(e.get("reason", "?")).split(":")[0])
                dropped[why] = dropped.get(why, 0) + 1
            elif kind == "request_stalled":
                stalls += 1
            elif kind == "holder_slow_kept":
                slow_kept += 1
            elif kind == "admitted":
                key = (str(home), str(e.get("requester")))
                per_pair[key] = per_pair.get(key, 0) + 1
            else:
                totals.append(e)
    pairs = list(per_pair.values())
    # Block requests each node made, by purpose/level (ExchangeStats.by_purpose): per node per
    # round, and blocks named per request.
    by_purpose: dict[str, list[int]] = {}
    for t in totals:
        for key, (reqs, blocks, nbytes) in (t.get("by_purpose") or {}).items():
            acc = by_purpose.setdefault(key, [0, 0, 0])
            acc[0], acc[1], acc[2] = acc[0] + reqs, acc[1] + blocks, acc[2] + nbytes
    per = max(len(totals), 1) * played
    requests = {
        key: {
            "per_node_round": round(reqs / per, 1),
            "blocks_per_request": round(blocks / max(reqs, 1), 2),
            "kb_per_request": round(nbytes / 1e3 / max(reqs, 1), 1),
        }
        for key, (reqs, blocks, nbytes) in sorted(by_purpose.items())
    }

    def mean(key: str) -> float | None:
        xs = [float(t[key]) for t in totals if t.get(key) is not None and t.get("requests", 1)]
        return round(statistics.mean(xs), 3) if xs else None

    return {
        "holder_dropped": dropped,
        "request_stalled": stalls,
        "holder_slow_kept": slow_kept,
        "admissions": sum(pairs),
        "admissions_per_connection_per_round_max": round(max(pairs, default=0) / played, 2),
        "admissions_per_connection_per_round_mean": round(
            sum(pairs) / max(len(pairs), 1) / played, 2
        ),
        "ttfb_mean_s": mean("ttfb_mean_s"),
        "ttfb_max_s": max((float(t.get("ttfb_max_s", 0)) for t in totals), default=None),
        "open_mean_s": mean("open_mean_s"),
        "serve_wait_mean_s": mean("serve_wait_mean_s"),
        "serve_wait_max_s": max(
            (float(t.get("serve_wait_max_s", 0)) for t in totals), default=None
        ),
        "request_mb_per_s": mean("request_mb_per_s"),
        "nodes_reporting_totals": len(totals),
        "block_requests_per_node_round": round(sum(v[0] for v in by_purpose.values()) / per, 1),
        "block_requests_by_purpose": requests,
    }


def _idle_by_phase(
    events: dict[Path, list[dict[str, Any]]], began: float, sampler: IdleSampler
) -> dict[str, Any]:
    """Idle CPU in each round's train and exchange windows (swarm-wide), and overall."""
    published: dict[int, list[float]] = {}
    assembled: dict[int, list[float]] = {}
    for evs in events.values():
        for e in evs:
            if e.get("published_at") is not None:
                published.setdefault(e["round"], []).append(float(e["published_at"]))
            if e.get("assembled_at") is not None:
                assembled.setdefault(e["round"], []).append(float(e["assembled_at"]))
    rounds = []
    start = began
    spans: dict[str, list[tuple[float, float]]] = {"train": [], "exchange": []}
    for r in sorted(set(published) & set(assembled)):
        first_pub, last_asm = min(published[r]), max(assembled[r])
        rounds.append(
            {
                "round": r,
                "train_s": round(first_pub - start, 1),
                "train_idle": sampler.idle(start, first_pub),
                "exchange_s": round(last_asm - first_pub, 1),
                "exchange_idle": sampler.idle(first_pub, last_asm),
            }
        )
        spans["train"].append((start, first_pub))
        spans["exchange"].append((first_pub, last_asm))
        start = last_asm

    def overall(kind: str) -> float | None:
        got = [f for t, f in sampler.samples for a, b in spans[kind] if a < t <= b]
        return round(statistics.mean(got), 3) if got else None

    return {"rounds": rounds, "train_idle": overall("train"), "exchange_idle": overall("exchange")}


def _init_homes(work: Path, n: int) -> list[tuple[Path, str]]:
    """n node homes as users make them; (home, peer id) each."""
    homes = [work / f"node-{i:02d}" for i in range(n)]
    return list(zip(homes, init_homes(homes), strict=True))


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def run_size(
    n: int,
    rounds: int,
    timeout_s: float,
    keep: Path | None = None,
    codec: str | None = None,
    count_gossip: bool = False,
) -> dict[str, Any]:
    with TemporaryDirectory(prefix=f"cnode-swarm{n}-") as tmp:
        work = Path(tmp) if keep is None else keep / f"swarm{n}"
        work.mkdir(parents=True, exist_ok=True)
        nodes = _init_homes(work, n)
        codec_keys = new_run_training(*([codec] if codec else []))
        training = {**codec_keys, "model": MODEL, "local_steps": 1}
        peers = [peer for _, peer in nodes]
        coordinator = start_coordinator(work, RUN, peers, training, collect_timeout_s=120.0)
        procs: list[subprocess.Popen[bytes]] = []
        began = time.monotonic()
        wall_began = time.time()
        with IdleSampler() as sampler:
            try:
                start_requests, start_cpu = _metrics(coordinator.url)
                homes = [home for home, _ in nodes]
                probe = _gossip_probe_env(work / "gossip") if count_gossip else None
                procs = start_nodes(homes, RUN, work / "run.toml", coordinator.url, rounds, probe)
                wait_all(procs, timeout_s)
                broken = any(p.poll() is None for p in procs)
                end_requests, end_cpu = _metrics(coordinator.url)
            finally:
                stop_all(procs)
                coordinator.stop()
        figures = _figures(n, rounds, nodes, procs, began, broken, (start_requests, start_cpu),
                           (end_requests, end_cpu))  # fmt: skip
        events = {home: report_events(home, "round") for home, _ in nodes}
        figures["idle"] = _idle_by_phase(events, wall_began, sampler)
        figures["exchange"] = _exchange_counts(nodes, max(figures["rounds_done"], 1))
        if count_gossip:
            figures["gossip"] = _gossip_counts(work / "gossip", n, max(figures["rounds_done"], 1))
        return figures


def _gossip_probe_env(out: Path) -> dict[str, str]:
    """The nodes' environment for bench/gossip_probe (its sitecustomize counts what each
    node's gossipsub router sends)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [str(Path(__file__).parent / "gossip_probe"), os.environ.get("PYTHONPATH", "")]
    pythonpath = os.pathsep.join(p for p in paths if p)
    return {"PYTHONPATH": pythonpath, "CNODE_GOSSIP_PROBE_DIR": str(out)}


def _gossip_counts(out: Path, n: int, played: int) -> dict[str, Any]:
    """What the nodes' routers sent, per node per round played (startup included): RPCs, kB,
    messages by topic, control entries. Each RPC sent is one received."""
    total: dict[str, float] = {}
    nodes = 0
    for path in out.glob("*.json"):
        counts = json.loads(path.read_text(encoding="utf-8"))
        if counts.get("rpcs"):  # a node, not a `cnode init` or the coordinator's idle router
            nodes += 1
            for key, value in counts.items():
                total[key] = total.get(key, 0) + value
    per = max(nodes, 1) * played
    topics = {k.split(" ", 1)[1]: round(v / per, 1) for k, v in total.items() if " " in k}
    return {
        "nodes": nodes,
        "rpcs_per_node_round": round(total.get("rpcs", 0) / per, 1),
        "kb_per_node_round": round(total.get("bytes", 0) / per / 1000, 1),
        "messages_per_node_round": topics,
        "control_per_node_round": {
            k: round(total.get(k, 0) / per, 1) for k in ("ihave", "iwant", "graft", "prune")
        },
    }


def _figures(
    n: int,
    rounds: int,
    nodes: list[tuple[Path, str]],
    procs: list[subprocess.Popen[bytes]],
    began: float,
    broken: bool,
    start: tuple[dict[str, float], float],
    end: tuple[dict[str, float], float],
) -> dict[str, Any]:
    events = {home: report_events(home, "round") for home, _ in nodes}
    finals: dict[int, set[str]] = {e[-1]["round"]: set() for e in events.values() if e}
    for evs in events.values():
        if evs:
            finals[evs[-1]["round"]].add(evs[-1]["state_cid"])
    times: dict[int, float] = {}
    for evs in events.values():
        for e in evs:
            times[e["round"]] = max(times.get(e["round"], 0.0), float(e["t"]))
    ordered = sorted(times)
    gaps = [times[b] - times[a] for a, b in itertools.pairwise(ordered)]
    phase = {
        k: _median([float(e[k]) for evs in events.values() for e in evs if e.get(k) is not None])
        for k in ("train_s", "publish_s", "fetch_s", "aggregate_s")
    }
    bytes_in = _median([float(e["bytes_in"]) for evs in events.values() for e in evs[1:]])
    # Every block byte, roots and signed records included (round events since issue 41)
    blocks_in = _median([float(e["blocks_in"]) for evs in events.values() for e in evs[1:]
                         if "blocks_in" in e])  # fmt: skip
    # One member's CPU a round (its process, every thread; rounds 2 on: round 1 has the start)
    cpu = _median([float(e["cpu_s"]) for evs in events.values() for e in evs[1:] if "cpu_s" in e])
    played = max(len(ordered), 1)
    stops = [e.get("stop_reason") for home, _ in nodes for e in report_events(home, "stopped")]
    return {
        "n": n,
        "rounds_done": len(ordered),
        "broken": broken or len(ordered) < rounds,
        "where": None if not broken else f"after round {ordered[-1] if ordered else 0}",
        "s_per_round": _median(gaps),
        "phase_median_s": phase,
        "bytes_in_per_peer_round": bytes_in,
        "blocks_in_per_peer_round": blocks_in,
        "member_cpu_s_per_round": cpu,
        "coordinator_requests_per_round": round(
            (sum(end[0].values()) - sum(start[0].values())) / played, 1
        ),
        "coordinator_requests_per_round_by_route": {
            route: round((count - start[0].get(route, 0.0)) / played, 1)
            for route, count in sorted(end[0].items())
            if count > start[0].get(route, 0.0)
        },
        "coordinator_cpu_s_per_round": round((end[1] - start[1]) / played, 2),
        "one_state_cid_at_the_end": len(finals.get(rounds, set())) == 1
        and sum(1 for evs in events.values() if evs and evs[-1]["round"] == rounds) == n,
        "stop_reasons": {r: stops.count(r) for r in set(stops)},
        "exit_codes": sorted({p.returncode for p in procs}),
        "wall_s": round(time.monotonic() - began, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="4,8,16,32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=900.0, help="per size")
    p.add_argument("--keep", type=Path, help="keep every size's homes and logs under this folder")
    p.add_argument("--codec", help="training.update_codec (default: a new run's, sparse-topk)")
    p.add_argument("--count-gossip", action="store_true",
                   help="count what each node's gossipsub sends (bench/gossip_probe)")  # fmt: skip
    args = p.parse_args()
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        print(f"-- {n} nodes", flush=True)
        result = run_size(n, args.rounds, args.timeout_s, args.keep, args.codec, args.count_gossip)
        print(json.dumps(result), flush=True)
        results.append(result)
        if result["broken"]:
            print(f"{n} nodes did not finish {args.rounds} rounds: larger sizes skipped")
            break
    _print_tables(results)
    return 0 if results and not results[-1]["broken"] else 1


def _print_tables(results: list[dict[str, Any]]) -> None:
    base = results[0].get("bytes_in_per_peer_round") if results else None
    print("\nn | s/round | bytes in/peer/round (x smallest n) | coord req/round | coord CPU s/round"
          " | one CID | idle: train / exchange | holder_dropped | stalls | admissions/conn/round"
          " (max)")  # fmt: skip
    for r in results:
        mine = r["bytes_in_per_peer_round"]
        ratio = mine / base if base and mine else None
        ex = r["exchange"]
        print(
            f"{r['n']} | {r['s_per_round']} | {r['bytes_in_per_peer_round']} "
            f"({ratio and round(ratio, 2)}x) | {r['coordinator_requests_per_round']} | "
            f"{r['coordinator_cpu_s_per_round']} | {r['one_state_cid_at_the_end']} | "
            f"{r['idle']['train_idle']} / {r['idle']['exchange_idle']} | "
            f"{sum(ex['holder_dropped'].values())} {ex['holder_dropped'] or ''} | "
            f"{ex['request_stalled']} | {ex['admissions_per_connection_per_round_mean']} "
            f"({ex['admissions_per_connection_per_round_max']})"
        )
    print("\nevery block byte in per peer per round, roots and records included (x smallest n):"
          " n | blocks_in | x")  # fmt: skip
    first_blocks = results[0].get("blocks_in_per_peer_round") if results else None
    for r in results:
        mine = r.get("blocks_in_per_peer_round")
        ratio = mine / first_blocks if mine and first_blocks else None
        print(f"{r['n']} | {mine} | {ratio and round(ratio, 2)}")
    print("\none member's cost: n | s/round (x smallest n) | CPU s per member per round, median of"
          " rounds 2+ (x smallest n) | members x CPU s / s per round (cores busy)")  # fmt: skip
    first = results[0] if results else {}
    for r in results:
        secs, cpu = r["s_per_round"], r["member_cpu_s_per_round"]
        x_secs = secs / first["s_per_round"] if secs and first.get("s_per_round") else None
        base_cpu = first.get("member_cpu_s_per_round")
        x_cpu = cpu / base_cpu if cpu and base_cpu else None
        busy = r["n"] * cpu / secs if cpu and secs else None
        print(f"{r['n']} | {secs} ({x_secs and round(x_secs, 2)}x) | {cpu} "
              f"({x_cpu and round(x_cpu, 2)}x) | {busy and round(busy, 2)}")  # fmt: skip
    print("\nblock requests per node per round: n | purpose/level | requests | blocks/request"
          " | kB/request")  # fmt: skip
    for r in results:
        ex = r["exchange"]
        print(f"{r['n']} | all | {ex['block_requests_per_node_round']} | | ")
        for key, x in ex["block_requests_by_purpose"].items():
            print(f"{r['n']} | {key} | {x['per_node_round']} | {x['blocks_per_request']} | "
                  f"{x['kb_per_request']}")  # fmt: skip
    print(
        "\nper round: n | round | train s (idle) | exchange s, first publish to last state (idle)"
    )
    for r in results:
        for x in r["idle"]["rounds"]:
            print(
                f"{r['n']} | {x['round']} | {x['train_s']} ({x['train_idle']}) | "
                f"{x['exchange_s']} ({x['exchange_idle']})"
            )
    gossip = [r for r in results if "gossip" in r]
    if gossip:
        print("\ngossip sent per node per round (startup included): n | RPCs | kB | messages by"
              " topic | ihave / iwant / graft / prune")  # fmt: skip
    for r in gossip:
        g, c = r["gossip"], r["gossip"]["control_per_node_round"]
        print(f"{r['n']} | {g['rpcs_per_node_round']} | {g['kb_per_node_round']} | "
              f"{g['messages_per_node_round']} | {c['ihave']} / {c['iwant']} / {c['graft']} / "
              f"{c['prune']}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
