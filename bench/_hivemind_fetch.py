"""hivemind's state download, measured the way ``bench/fetch.py`` measures cnode's fetch.

Run with the python of a venv that has hivemind 1.1.12 (never cnode's; this file imports no cnode):
``/opt/hivemind-venv/bin/python bench/_hivemind_fetch.py --size-mb 400``. Prints one line
``hivemind_fetch <bytes> <seconds> <MB/s>`` (MB = 1e6 bytes) on stdout; logs go to stderr.

Two processes on 127.0.0.1, each with its own hivemind DHT (its own p2pd daemon) and
``DecentralizedAverager``:

- the holder owns the model state: float32 layers of 4 Mi elements (16 MiB), seeded exactly like
  ``bench/fetch.py``'s checkpoint (``torch.Generator().manual_seed(0)``, ``torch.randn`` per
  layer, ``size_mb * 1e6 // 16 MiB`` layers), as the averaged tensors, and allows state sharing;
- the joiner bootstraps its DHT from the holder, waits (bounded) until the holder's state-sharing
  declaration (``<prefix>.all_averagers``) is visible in the DHT, then times one call of
  ``DecentralizedAverager.load_state_from_peers``: the DHT look-up of who shares state, the
  ``rpc_download_state`` stream (p2pd, TLS, 64 KiB protobuf parts) and the deserialised tensors
  handed back to the joiner's main process. ``hivemind.Optimizer.load_state_from_peers`` does the
  same (through ``TrainingStateAverager``, whose state also carries optimizer statistics); the
  plain averager carries exactly the model tensors, the same bytes as cnode's checkpoint.

hivemind does NO content verification of the received bytes: no hash, no signature; the joiner
takes whatever the chosen peer streams. After the timed call this script compares the tensors with
the seeded originals (outside the measurement), to check the bench itself, not as a hivemind
feature. Every wait is bounded (``--timeout``); both processes run in their own process groups
(hivemind's p2pd daemons included) and are stopped at the end, also on error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time

LAYER = 4 * 1024 * 1024  # float32 elements: 16 MiB, as in bench/fetch.py
PREFIX = "cnodebench"
HOST = "/ip4/127.0.0.1/tcp/0"


def _n_layers(size_mb: int) -> int:
    return max(1, size_mb * 1_000_000 // (LAYER * 4))


def _tensors(size_mb: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    return [torch.randn(LAYER, generator=gen) for _ in range(_n_layers(size_mb))]


def _dht(initial_peers=None, host=HOST):
    import hivemind

    # Loopback (or a testbed host's address): no UPnP, AutoNAT or relays; the transport (p2pd,
    # TLS, yamux) is hivemind's.
    return hivemind.DHT(
        initial_peers=initial_peers,
        start=True,
        host_maddrs=[host],
        nat_port_map=False,
        auto_nat=False,
        use_relay=False,
    )


def _holder(args: argparse.Namespace) -> None:
    import hivemind

    tensors = _tensors(args.size_mb)
    dht = _dht()
    averager = None
    try:
        averager = hivemind.DecentralizedAverager(
            tensors, dht, prefix=PREFIX, start=True, allow_state_sharing=True
        )
        maddrs = [str(m) for m in dht.get_visible_maddrs()]
        print(json.dumps(maddrs), flush=True)
        # Serve until the parent writes a line or closes stdin; never longer than --timeout.
        sel = selectors.DefaultSelector()
        sel.register(sys.stdin, selectors.EVENT_READ)
        sel.select(timeout=args.timeout)
    finally:
        if averager is not None:
            averager.shutdown()
        dht.shutdown()


def _joiner(args: argparse.Namespace) -> None:
    import hivemind
    import torch

    deadline = time.monotonic() + args.timeout
    dht = _dht(json.loads(args.maddrs))
    averager = None
    try:
        # Same shapes as the holder's, zeros: a late joiner's fresh model.
        mine = [torch.zeros(LAYER) for _ in range(_n_layers(args.size_mb))]
        averager = hivemind.DecentralizedAverager(
            mine,
            dht,
            prefix=PREFIX,
            start=True,
            allow_state_sharing=False,
            # load_state_from_peers uses this as the per-part timeout (its default, 3 s
            # request_timeout, is too tight for two loaded cores)
            next_chunk_timeout=60.0,
        )
        key = f"{PREFIX}.all_averagers"
        while True:  # connected and the holder's declaration visible, before timing
            found = dht.get(key, latest=True)
            if found is not None and any(
                isinstance(v.value, (int, float)) for v in found.value.values()
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"holder's state declaration not in the DHT ({key})")
            time.sleep(0.2)

        t = time.perf_counter()
        result = averager.load_state_from_peers(timeout=max(1.0, deadline - time.monotonic()))
        seconds = time.perf_counter() - t
        if result is None:
            raise RuntimeError("load_state_from_peers returned None (no state downloaded)")
        _metadata, got = result
        nbytes = sum(x.numel() * x.element_size() for x in got)
        print(f"hivemind_fetch {nbytes} {seconds:.3f} {nbytes / 1e6 / seconds:.1f}", flush=True)

        # The bench's own check (hivemind verifies nothing): same bytes as the seeded originals?
        want = _tensors(args.size_mb)
        same = len(got) == len(want) and all(
            torch.equal(a, b) for a, b in zip(got, want, strict=True)
        )
        print(f"hivemind_check {'ok' if same else 'MISMATCH'}", flush=True)
    finally:
        if averager is not None:
            averager.shutdown()
        dht.shutdown()


def _spawn(args: argparse.Namespace, role: str, log, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role]
    cmd += ["--size-mb", str(args.size_mb), "--timeout", str(args.timeout), *extra]
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,  # its own group: its hivemind children and p2pd die with it
    )


def _stop(proc: subprocess.Popen[str], grace: float = 20.0) -> None:
    """Ask politely (close stdin), then SIGTERM, then SIGKILL the process group we started."""
    try:
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    with contextlib.suppress(ProcessLookupError):  # leftovers of the group (p2pd daemons)
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout=timeout):
        raise TimeoutError(f"no line from pid {proc.pid} in {timeout:.0f} s")
    line = proc.stdout.readline()
    if not line:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        raise RuntimeError(f"pid {proc.pid} exited (rc {proc.poll()}) before printing its line")
    return line.strip()


def _tail(path: str, n: int = 15) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def _orchestrate(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    with tempfile.TemporaryDirectory(prefix="hivemind-bench-") as tmp:
        holder_log, joiner_log = os.path.join(tmp, "holder.log"), os.path.join(tmp, "joiner.log")
        procs: list[tuple[subprocess.Popen[str], str]] = []
        try:
            with open(holder_log, "w") as log:
                holder = _spawn(args, "holder", log)
            procs.append((holder, holder_log))
            maddrs = _read_line(holder, max(1.0, deadline - time.monotonic()))
            with open(joiner_log, "w") as log:
                joiner = _spawn(args, "joiner", log, "--maddrs", maddrs)
            procs.append((joiner, joiner_log))
            try:
                out, _ = joiner.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as e:
                raise TimeoutError(f"joiner not done within --timeout {args.timeout} s") from e
            lines = out.splitlines()
            fetch = [x for x in lines if x.startswith("hivemind_fetch ")]
            if joiner.returncode != 0 or not fetch:
                raise RuntimeError(f"joiner failed (rc {joiner.returncode})")
            with open(joiner_log, errors="replace") as f:
                logged = re.findall(r"Finished downloading state in ([0-9.]+)s", f.read())
            if logged:  # hivemind's own figure: the stream alone, inside the averager process
                print(f"# hivemind's log: stream finished in {logged[-1]} s", file=sys.stderr)
            for x in lines:
                if x.startswith("hivemind_check "):
                    print(f"# {x}", file=sys.stderr)
            print(fetch[-1], flush=True)
            return 0
        except Exception as e:  # report why, with the children's last log lines
            print(f"hivemind_fetch failed: {type(e).__name__}: {e}", file=sys.stderr)
            for proc, log_path in procs:
                print(f"--- pid {proc.pid} log tail ---\n{_tail(log_path)}", file=sys.stderr)
            return 1
        finally:
            for proc, _ in reversed(procs):
                _stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=400)
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run, s")
    parser.add_argument("--role", choices=("holder", "joiner"), help=argparse.SUPPRESS)
    parser.add_argument("--maddrs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "holder":
        _holder(args)
    elif args.role == "joiner":
        _joiner(args)
    else:
        sys.exit(_orchestrate(args))


if __name__ == "__main__":
    main()
