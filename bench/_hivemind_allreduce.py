"""hivemind 1.1.12's all-reduce of one float32 model, for ``bench/round.py`` to compare with.

Run with the python of a venv that has hivemind 1.1.12 (never cnode's; this file imports no cnode):
``/opt/hivemind-venv/bin/python bench/_hivemind_allreduce.py --peers 4 --numel 10152000``. Prints
one line ``hivemind_allreduce <median s> <max s> <rounds>`` on stdout; logs go to stderr.

N processes on 127.0.0.1, each with its own hivemind DHT (its own p2pd daemon, the first the
others' bootstrap) and a ``DecentralizedAverager`` over one float32 tensor of ``--numel`` values
(random, seeded per peer): the same bytes as the model ``bench/round.py`` trains. Per round each
peer schedules a step with ``require_trigger=True`` (hivemind's Optimizer pre-schedules the same
way, so matchmaking overlaps training), waits until its group of N is formed
(``AWAITING_TRIGGER``), then, at a wall-clock instant the first peer announced, triggers it
(``allow_allreduce``) and times until the averaged tensor is back: the butterfly all-reduce
(each peer reduces 1/N of the vector, p2pd streams, 512 KiB parts), without the matchmaking.
The figure is the median over peers of the last round (the first warms the streams); the max is
printed too. ``--netns``: peer i runs in network namespace ``cb<i>`` of
../shared/tools/netbed.sh, on its host address 10.77.0.(10 + i) (bench/capped_round.py: the same
capped links as cnode's nodes). Every wait is bounded (``--timeout``); every process runs in its
own process group and is stopped at the end, also on error (the helpers of
``_hivemind_fetch.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _hivemind_fetch import _dht, _read_line, _stop, _tail

PREFIX = "cnodebenchar"
GROUP_WAIT_S = 120.0
TRIGGER_MARGIN_S = 2.0


def _peer(args: argparse.Namespace) -> None:
    import hivemind
    import torch
    from hivemind.averaging.control import AveragingStage
    from hivemind.utils import get_dht_time

    deadline = time.monotonic() + args.timeout
    host = f"/ip4/10.77.0.{10 + args.index}/tcp/0" if args.netns else "/ip4/127.0.0.1/tcp/0"
    dht = _dht(json.loads(args.maddrs) if args.maddrs else None, host)
    averager = None
    try:
        if not args.maddrs:
            print(json.dumps([str(m) for m in dht.get_visible_maddrs()]), flush=True)
        tensor = torch.randn(args.numel, generator=torch.Generator().manual_seed(args.index))
        averager = hivemind.DecentralizedAverager(
            [tensor], dht, prefix=PREFIX, start=True, target_group_size=args.peers,
            min_group_size=args.peers, min_matchmaking_time=2.0, request_timeout=10.0,
            next_chunk_timeout=60.0, allreduce_timeout=300.0,
        )  # fmt: skip
        for round_ in range(args.rounds):
            control = averager.step(
                scheduled_time=get_dht_time() + 5.0, require_trigger=True, wait=False,
                timeout=max(1.0, deadline - time.monotonic()),
            )  # fmt: skip
            while control.stage != AveragingStage.AWAITING_TRIGGER:
                if control.done() or time.monotonic() > deadline:
                    control.result(timeout=1.0)  # raises what went wrong
                    raise TimeoutError(f"round {round_}: no group of {args.peers} formed")
                time.sleep(0.01)
            # Every peer triggers at the same wall-clock instant (one machine, one clock): the
            # next multiple of TRIGGER_MARGIN_S after all have had time to form the group.
            go = (int(time.time() / TRIGGER_MARGIN_S) + 2) * TRIGGER_MARGIN_S
            time.sleep(max(0.0, go - time.time()))
            began = time.perf_counter()
            control.allow_allreduce()
            control.result(timeout=max(1.0, deadline - time.monotonic()))
            print(f"round {round_} {time.perf_counter() - began:.4f}", flush=True)
    finally:
        if averager is not None:
            averager.shutdown()
        dht.shutdown()


def _spawn(args: argparse.Namespace, index: int, log, maddrs: str) -> subprocess.Popen[str]:
    wrap = ["ip", "netns", "exec", f"cb{index}"] if args.netns else []
    cmd = [*wrap, sys.executable, os.path.abspath(__file__), "--role", "peer"]
    cmd += ["--index", str(index)] + (["--netns"] if args.netns else [])
    cmd += ["--peers", str(args.peers), "--numel", str(args.numel), "--rounds", str(args.rounds)]
    cmd += ["--timeout", str(args.timeout)] + (["--maddrs", maddrs] if maddrs else [])
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
        start_new_session=True,
    )  # fmt: skip


def _orchestrate(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    with tempfile.TemporaryDirectory(prefix="hivemind-allreduce-") as tmp:
        procs: list[tuple[subprocess.Popen[str], str]] = []
        try:
            maddrs = ""
            for i in range(args.peers):
                path = os.path.join(tmp, f"peer{i}.log")
                with open(path, "w") as log:
                    procs.append((_spawn(args, i, log, maddrs), path))
                if i == 0:
                    maddrs = _read_line(procs[0][0], max(1.0, deadline - time.monotonic()))
            last = []
            for proc, _ in procs:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                rounds = [x.split() for x in out.splitlines() if x.startswith("round ")]
                if proc.returncode != 0 or len(rounds) != args.rounds:
                    raise RuntimeError(f"pid {proc.pid} failed (rc {proc.returncode})")
                last.append(float(rounds[-1][2]))
            print(
                f"hivemind_allreduce {statistics.median(last):.4f} {max(last):.4f} {args.rounds}",
                flush=True,
            )
            return 0
        except Exception as e:  # report why, with the children's last log lines
            print(f"hivemind_allreduce failed: {type(e).__name__}: {e}", file=sys.stderr)
            for proc, log_path in procs:
                print(f"--- pid {proc.pid} log tail ---\n{_tail(log_path)}", file=sys.stderr)
            return 1
        finally:
            for proc, _ in reversed(procs):
                _stop(proc)


def hivemind_python() -> str | None:
    """The python of a venv with hivemind: ``CNODE_BENCH_HIVEMIND_PYTHON`` or
    ``/opt/hivemind-venv/bin/python`` when it imports hivemind; None where there is none."""
    python = os.environ.get("CNODE_BENCH_HIVEMIND_PYTHON")
    if python is not None:
        return python
    default = "/opt/hivemind-venv/bin/python"
    try:
        probe = subprocess.run([default, "-c", "import hivemind"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return default if probe.returncode == 0 else None


def measure(peers: int, numel: int, netns: bool = False) -> tuple[float, float] | None:
    """hivemind's all-reduce of ``numel`` float32 values over ``peers`` processes, run from
    cnode's bench (this script under hivemind's python): (median s, max s), or None where
    hivemind is absent or the run failed (the reason printed)."""
    python = hivemind_python()
    if python is None:
        print(
            "hivemind: not installed here (set CNODE_BENCH_HIVEMIND_PYTHON to a venv's python "
            "that has hivemind 1.1.12)"
        )
        return None
    cmd = [python, os.path.abspath(__file__), "--peers", str(peers), "--numel", str(numel)]
    cmd += ["--netns"] if netns else []
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=450)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"hivemind ({python}): not measured: {type(e).__name__}: {e}")
        return None
    line = next((x for x in done.stdout.splitlines() if x.startswith("hivemind_allreduce ")), "")
    if done.returncode != 0 or not line:
        errs = [x for x in done.stderr.splitlines() if x.startswith("hivemind_allreduce failed")]
        print(f"hivemind ({python}): not measured (rc {done.returncode}): {errs or 'no output'}")
        return None
    median, most = float(line.split()[1]), float(line.split()[2])
    return median, most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--numel", type=int, default=10_152_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=400.0, help="bound on the whole run, s")
    parser.add_argument("--netns", action="store_true", help="peer i in namespace cb<i>")
    parser.add_argument("--role", choices=("peer",), help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--maddrs", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "peer":
        _peer(args)
    else:
        sys.exit(_orchestrate(args))


if __name__ == "__main__":
    main()
