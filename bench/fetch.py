"""Benchmark of /cnode/blocks/1.0.0 fetches (issue 5). Run once: ``python bench/fetch.py``.

1. Uncapped loopback: a 400 MB checkpoint from 1 holder process to a joiner process
   (``cnode checkpoint fetch``), MB/s against a raw libp2p stream (Noise + yamux, same host
   settings: yamux frames that fit one Noise message, buffered TCP reads, batched window
   updates: defects 12-14) between two processes in the same run, against one with
   py-libp2p's own settings, and against the tuned stream whose receiver also hashes every
   1 MiB block and writes it to a BlockStore (one fsync at the end): the work a verified,
   stored fetch cannot avoid, without cnode's protocol. Peak RSS of the joiner.
2. Capped: k = 1, 2, 4 holder processes, each capped at R bytes/s by its own token bucket
   (``--rate``); fetch time against the ideal size / (k * R). R defaults to 5 MB/s so that
   4R stays below what one (shared, loaded) core here verifies and stores.

3. Gateway (issue 14): one holder process serving both ``/cnode/blocks/1.0.0`` and a trustless
   HTTP gateway (``--gateway``); the same checkpoint fetched by a joiner process over libp2p,
   over the gateway (raw blocks) and over the gateway (one-block CARs), in the same run.
   ``--only gateway`` runs just this part (``--gateway-mb``, default 200).

4. A link with a round-trip time (``--rtt-ms``, default 20; ``--rtt-mb``, default 100): the
   joiner reaches the holder through bench/_delay_proxy.py, which holds every byte for half the
   round trip each way (this kernel has no netem). Fetch MB/s against a raw stream over the same
   relay, then against the cap of a holder capped at ``--rtt-rate``. Over such a link each
   request pays round trips (its stream's protocol select, then its first block) that one long
   stream pays once. ``--only rtt`` runs just this.

Fetch time is what the joiner reports for the transfer itself (after connecting). Figures go to
stdout; nothing is asserted. Part 1 also reports CPU seconds of each side (the joiner's minus a
second, empty fetch: start-up and connect) and the throughput each would reach on a core of its
own, which a shared, loaded machine disturbs far less than wall-clock MB/s.
Sizes: ``--size-mb`` (default 400) and ``--capped-mb`` (100);
``--uncapped-only`` runs part 1 alone.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _raw_stream import cpu_s, delay_proxy, port_of, raw_stream, stop, through

from cnode.storage import BlockStore, CheckpointMeta, save_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def _make_checkpoint(store_dir: Path, size_mb: int) -> str:
    layer = 4 * 1024 * 1024  # 16 MiB layers of float32: realistic multi-chunk layers
    n = max(1, size_mb * 1_000_000 // (layer * 4))
    gen = torch.Generator().manual_seed(0)
    tensors = {f"layer.{i}": torch.randn(layer, generator=gen) for i in range(n)}
    return str(save_checkpoint(BlockStore(store_dir), tensors, CheckpointMeta(run_id="bench")))


def _home(base: Path, name: str, store_dir: Path) -> Path:
    home = base / name
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'storage_path = "{store_dir}"\n')
    return home


def _cnode(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cnode", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _start_holders(homes: list[Path], rate: int) -> list[tuple[subprocess.Popen[str], str]]:
    procs = [
        _cnode(
            "checkpoint",
            "serve",
            *("--home", str(h), "--listen", "/ip4/127.0.0.1/tcp/0"),
            *("--open", "--rate", str(rate)),
        )
        for h in homes
    ]
    out = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("listening "):
            raise SystemExit(f"holder did not start: {line!r}")
        out.append((proc, line.split(" ", 1)[1]))
    return out


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_last_fetch_cpu = 0.0  # CPU seconds of the latest joiner process (set by _fetch)


def _fetch(
    home: Path, root: str, addrs: list[str], extra: tuple[str, ...] = ()
) -> tuple[float, float, int]:
    """Run a joiner process; return (transfer seconds, MB/s, peak RSS bytes)."""
    global _last_fetch_cpu
    cpu_before = _children_cpu_s()
    args = [sys.executable, "-m", "cnode", "checkpoint", "fetch", root, "--home", str(home)]
    for addr in addrs:
        args += ["--peer", addr]
    args += extra
    proc = subprocess.Popen(
        [*args, "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    # The joiner's own high-water mark (VmHWM), read until it exits. (ru_maxrss from wait4
    # is useless here: a vfork'ed child inherits this process's peak from before exec.)
    peak = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            break
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]) * 1024)
        time.sleep(0.05)
    assert proc.stdout is not None
    out = proc.stdout.read()
    if proc.wait() != 0:
        raise SystemExit(f"fetch failed ({proc.returncode}): {out}")
    _last_fetch_cpu = _children_cpu_s() - cpu_before  # only this child was reaped meanwhile
    line = next(x for x in out.splitlines() if x.startswith("fetched "))
    seconds = float(line.split(" in ")[1].split(" s ")[0])
    mb_per_s = float(line.split("(")[1].split(" MB/s")[0])
    return seconds, mb_per_s, peak


def _hivemind_note(size_mb: int, fetch_mbps: float) -> float | None:
    """hivemind 1.1.12's load_state_from_peers, same size and run, where a venv has it.

    hivemind is never a dependency of cnode: its python comes from ``CNODE_BENCH_HIVEMIND_PYTHON``
    or ``/opt/hivemind-venv/bin/python`` and runs ``bench/_hivemind_fetch.py`` (two processes on
    loopback, one holder, one joiner). Returns its MB/s, or None where it is absent or failed.
    """
    python = os.environ.get("CNODE_BENCH_HIVEMIND_PYTHON")
    if python is None:
        default = Path("/opt/hivemind-venv/bin/python")
        try:
            probe = subprocess.run(
                [str(default), "-c", "import hivemind"], capture_output=True, timeout=120
            )
            if probe.returncode == 0:
                python = str(default)
        except (OSError, subprocess.TimeoutExpired):
            pass  # absent or broken: reported as not installed
    if python is None:
        print(
            "hivemind: not installed here (set CNODE_BENCH_HIVEMIND_PYTHON to a venv's python "
            "that has it); issue 11 measured its unverified load_state_from_peers at 169 MB/s"
        )
        return None
    script = ROOT / "bench" / "_hivemind_fetch.py"
    cmd = [python, str(script), "--size-mb", str(size_mb), "--timeout", "540"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"hivemind ({python}): not measured: {type(e).__name__}: {e}")
        return None
    line = next((x for x in done.stdout.splitlines() if x.startswith("hivemind_fetch ")), None)
    if done.returncode != 0 or line is None:
        errs = done.stderr.splitlines()
        why = next((x for x in errs if x.startswith("hivemind_fetch failed")), None)
        why = why or (errs[-1] if errs else "no output")
        print(f"hivemind ({python}): not measured (rc {done.returncode}): {why}")
        return None
    nbytes, seconds, mbps = int(line.split()[1]), float(line.split()[2]), float(line.split()[3])
    print(
        f"hivemind 1.1.12 load_state_from_peers (unverified), same run: {mbps:.1f} MB/s "
        f"({nbytes / 1e6:.0f} MB in {seconds:.2f} s); "
        f"ratio cnode fetch / hivemind: {fetch_mbps / mbps:.2f}",
        flush=True,
    )
    return mbps


def _gateway_section(base: Path, size_mb: int) -> None:
    print(f"\n== one holder, libp2p vs trustless gateway, {size_mb} MB ==", flush=True)
    store = base / "gw-store"
    root = _make_checkpoint(store, size_mb)
    size = sum(p.stat().st_size for p in (store / "blocks").rglob("*") if p.is_file())
    proc = _cnode(
        "checkpoint",
        "serve",
        *("--home", str(_home(base, "gw", store)), "--listen", "/ip4/127.0.0.1/tcp/0"),
        *("--open", "--gateway", "127.0.0.1:0"),
    )
    try:
        assert proc.stdout is not None
        addr = proc.stdout.readline().strip().split(" ", 1)[1]
        url = proc.stdout.readline().strip().split(" ", 1)[1]
        runs = {
            "libp2p": ([addr], ()),
            "gateway raw": ([], ("--gateway", url)),
            "gateway car": ([], ("--gateway", url, "--gateway-format", "car")),
        }
        figures = {}
        for name, (addrs, extra) in runs.items():
            seconds, mbps, rss = _fetch(base / f"joiner-{name}", root, addrs, extra)
            figures[name] = mbps
            print(
                f"{name}: {size / 1e6:.0f} MB in {seconds:.2f} s = {mbps:.1f} MB/s "
                f"(joiner peak RSS {rss / 1e6:.0f} MB)",
                flush=True,
            )
            shutil.rmtree(base / f"joiner-{name}", ignore_errors=True)
        for name in ("gateway raw", "gateway car"):
            print(f"ratio {name} / libp2p: {figures[name] / figures['libp2p']:.2f}")
    finally:
        stop([proc])
        shutil.rmtree(store, ignore_errors=True)


def _delayed_section(base: Path, size_mb: int, rtt_ms: float, rate: int = 0) -> None:
    cap = f", holder capped at {rate / 1e6:g} MB/s" if rate else ""
    print(
        f"\n== one holder over a link of {rtt_ms:g} ms round trip{cap}, {size_mb} MB ==", flush=True
    )
    store = base / "rtt-store"
    root = _make_checkpoint(store, size_mb)
    size = sum(p.stat().st_size for p in (store / "blocks").rglob("*") if p.is_file())
    holders = _start_holders([_home(base, "rtt-holder", store)], rate)
    relays: list[subprocess.Popen[str]] = []
    try:
        addr = holders[0][1]
        relay, port = delay_proxy(port_of(addr), rtt_ms)
        relays.append(relay)
        seconds, mbps, _rss = _fetch(base / "rtt-joiner", root, [through(addr, port)])
    finally:
        stop([*relays, *(p for p, _ in holders)])
        shutil.rmtree(base / "rtt-joiner", ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    print(f"fetch: {size / 1e6:.0f} MB in {seconds:.2f} s = {mbps:.1f} MB/s (verified, stored)")
    if rate:
        print(f"ratio fetch / the holder's cap: {mbps / (rate / 1e6):.2f}")
        return
    raw, _cpu = raw_stream(size, rtt_ms=rtt_ms)
    print(f"raw libp2p stream over the same relay: {raw:.1f} MB/s")
    print(f"ratio fetch / raw stream: {mbps / raw:.2f}")


def _delayed_sections(base: Path, args: argparse.Namespace) -> None:
    _delayed_section(base, args.rtt_mb, args.rtt_ms)
    if args.rtt_rate:
        _delayed_section(base, args.rtt_mb // 2, args.rtt_ms, args.rtt_rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=400)
    parser.add_argument("--capped-mb", type=int, default=100)
    parser.add_argument("--gateway-mb", type=int, default=200)
    parser.add_argument("--rate", type=int, default=5_000_000, help="R, bytes/s per holder")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="round trip of part 4")
    parser.add_argument("--rtt-mb", type=int, default=100)
    parser.add_argument(
        "--rtt-rate", type=int, default=20_000_000, help="part 4's capped run: bytes/s (0: skip)"
    )
    parser.add_argument("--only", choices=("gateway", "rtt"), help="run only this part")
    parser.add_argument("--uncapped-only", action="store_true", help="skip part 2 (capped)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cnode-bench-fetch-"))
    if args.only is not None:
        try:
            if args.only == "gateway":
                _gateway_section(base, args.gateway_mb)
            else:
                _delayed_sections(base, args)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return
    try:
        print(f"== uncapped loopback, {args.size_mb} MB, 1 holder ==", flush=True)
        big = base / "big-store"
        t = time.monotonic()
        root = _make_checkpoint(big, args.size_mb)
        size = sum(p.stat().st_size for p in (big / "blocks").rglob("*") if p.is_file())
        print(f"checkpoint {root}: {size / 1e6:.0f} MB, made in {time.monotonic() - t:.0f} s")
        # Raw streams measured just before and just after the fetch (their mean is the baseline),
        # so a machine whose load changes during the run biases the ratio less.
        raw_before, raw_cpu = raw_stream(size)
        holders = _start_holders([_home(base, "h0", big)], 0)
        try:
            holder_cpu = cpu_s(holders[0][0].pid)
            seconds, mbps, rss = _fetch(base / "joiner0", root, [holders[0][1]])
            holder_cpu = cpu_s(holders[0][0].pid) - holder_cpu
            joiner_cpu = _last_fetch_cpu
            _fetch(base / "joiner0", root, [holders[0][1]])  # nothing left: start-up, connect
            joiner_cpu -= _last_fetch_cpu
        finally:
            stop([p for p, _ in holders])
        raw_after, _cpu = raw_stream(size)
        raw = (raw_before + raw_after) / 2
        raw_library, _cpu = raw_stream(size, "library")
        raw_stored, stored_cpu = raw_stream(size, store=base / "raw-store")
        shutil.rmtree(base / "raw-store", ignore_errors=True)
        print(f"fetch: {size / 1e6:.0f} MB in {seconds:.2f} s = {mbps:.1f} MB/s (verified, stored)")
        print(
            f"raw libp2p stream (noise+yamux, same run): {raw:.1f} MB/s "
            f"(before the fetch {raw_before:.1f}, after {raw_after:.1f})"
        )
        print(f"raw libp2p stream, py-libp2p's own settings: {raw_library:.1f} MB/s")
        print(f"ratio fetch / raw stream: {mbps / raw:.2f}")
        print(f"ratio fetch / raw stream with py-libp2p's own settings: {mbps / raw_library:.2f}")
        print(
            f"raw stream whose receiver also hashes and stores each 1 MiB block (the work any "
            f"verified, stored fetch does): {raw_stored:.1f} MB/s; receiver CPU "
            f"{stored_cpu[0]:.2f} s, sender {stored_cpu[1]:.2f} s"
        )
        print(f"ratio fetch / raw stream + hash + store: {mbps / raw_stored:.2f}")
        # On a shared machine wall-clock figures swing with others' load; CPU seconds do not
        # much. Capacity = the MB/s if each process had a core of its own: size / the busier.
        fetch_cap = size / 1e6 / max(joiner_cpu, holder_cpu)
        raw_cap = size / 1e6 / max(raw_cpu)
        print(
            f"CPU s for {size / 1e6:.0f} MB: joiner {joiner_cpu:.2f} (transfer only), holder "
            f"{holder_cpu:.2f}; raw stream receiver {raw_cpu[0]:.2f}, sender {raw_cpu[1]:.2f}"
        )
        print(
            f"CPU-bound capacity: fetch {fetch_cap:.0f} MB/s, raw stream {raw_cap:.0f} MB/s, "
            f"ratio {fetch_cap / raw_cap:.2f}"
        )
        _hivemind_note(args.size_mb, mbps)
        print(
            f"joiner peak RSS: {rss / 1e6:.0f} MB "
            f"(goal <= 256 MB above model size; model {size / 1e6:.0f} MB is streamed to disk)"
        )
        shutil.rmtree(base / "joiner0", ignore_errors=True)
        shutil.rmtree(big, ignore_errors=True)
        if args.uncapped_only:
            return

        print(
            f"\n== capped: k holders at R = {args.rate / 1e6:.1f} MB/s each, "
            f"{args.capped_mb} MB ==",
            flush=True,
        )
        small = base / "small-store"
        root = _make_checkpoint(small, args.capped_mb)
        size = sum(p.stat().st_size for p in (small / "blocks").rglob("*") if p.is_file())
        homes = [_home(base, f"c{i}", small) for i in range(4)]
        for k in (1, 2, 4):
            holders = _start_holders(homes[:k], args.rate)
            try:
                seconds, mbps, _rss = _fetch(base / f"joiner-k{k}", root, [a for _, a in holders])
            finally:
                stop([p for p, _ in holders])
            ideal = size / (k * args.rate)
            print(
                f"k={k}: {seconds:.2f} s ({mbps:.1f} MB/s); ideal {ideal:.2f} s; "
                f"ratio ideal/actual = {ideal / seconds:.2f} (goal >= 0.9)",
                flush=True,
            )
            shutil.rmtree(base / f"joiner-k{k}", ignore_errors=True)
        shutil.rmtree(small, ignore_errors=True)
        _gateway_section(base, args.gateway_mb)
        _delayed_sections(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
