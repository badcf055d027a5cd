"""Baselines for bench/fetch.py: a raw libp2p stream between two processes, bare or with a
receiver that hashes and stores each 1 MiB block, optionally through a relay that delays every
byte (bench/_delay_proxy.py); and the process helpers both use.

:func:`raw_stream` returns the stream's MB/s and the CPU seconds of its receiver and sender.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


RAW_SERVER = """
import random, sys, trio, multiaddr
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from cnode.node.p2p import _defects
N = int(sys.argv[1])
if sys.argv[2] == "tuned":
    _defects.fit_yamux_frames()
    _defects.buffer_tcp_reads()
    _defects.batch_window_updates()
async def main():
    kp = create_new_key_pair()
    host = new_host(
        key_pair=kp, sec_opt=_defects.secure_transports(kp), muxer_opt=_defects.muxers()
    )
    # Writes of 16 whole yamux frames (the library's or ours): the stream's best case.
    from libp2p.stream_muxer.yamux import yamux
    # Not zeros: a receiver that stores (--store) cuts it into 1 MiB blocks, which must differ.
    piece = random.Random(0).randbytes(16 * (yamux.MAX_MESSAGE_SIZE - 12))
    async def send(stream):
        sent = 0
        while sent < N:
            await stream.write(piece[: N - sent])
            sent += min(len(piece), N - sent)
        await stream.close()
    host.set_stream_handler(TProtocol("/bench/raw/1"), _defects.guard_handler("raw", send))
    async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        print(host.get_addrs()[0], flush=True)
        await trio.sleep_forever()
trio.run(main)
"""

RAW_CLIENT = """
import sys, time, trio, multiaddr
from pathlib import Path
from cnode.storage import BlockStore
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.peerinfo import info_from_p2p_addr
from cnode.node.p2p import _defects
async def main():
    _defects.remove_dial_delay()
    if sys.argv[2] == "tuned":
        _defects.fit_yamux_frames()
        _defects.buffer_tcp_reads()
        _defects.batch_window_updates()
    kp = create_new_key_pair()
    host = new_host(
        key_pair=kp, sec_opt=_defects.secure_transports(kp), muxer_opt=_defects.muxers()
    )
    async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        info = info_from_p2p_addr(multiaddr.Multiaddr(sys.argv[1]))
        await host.connect(info)
        start = time.monotonic()
        cpu = time.process_time()
        stream = await host.new_stream(info.peer_id, [TProtocol("/bench/raw/1")])
        total = 0
        pending = bytearray()
        async with trio.open_nursery() as nursery:
            ready, blocks = trio.open_memory_channel(1)
            if store is not None:
                nursery.start_soon(keep, blocks)
            async with ready:
                try:
                    while True:
                        data = await stream.read(1 << 20)
                        if not data:
                            break
                        total += len(data)
                        if store is not None:
                            pending += data
                            while len(pending) >= BLOCK:
                                await ready.send(bytes(pending[:BLOCK]))
                                del pending[:BLOCK]
                except StreamEOF:
                    pass
                if store is not None and pending:
                    await ready.send(bytes(pending))
        if store is not None:
            await trio.to_thread.run_sync(batch.commit)
        print(total, time.monotonic() - start, time.process_time() - cpu, flush=True)
# --store DIR: the least a verified, stored fetch must do besides the stream: each 1 MiB block
# hashed (its CID) and written to a BlockStore (one fsync at the end), in a worker thread while
# the next one arrives, as cnode's fetch does.
BLOCK = 1 << 20
store = BlockStore(Path(sys.argv[3])) if len(sys.argv) > 3 else None
batch = store.unsynced_save() if store is not None else None
async def keep(blocks):
    async for block in blocks:
        await trio.to_thread.run_sync(lambda: store.put_new(block, batch=batch))
trio.run(main)
"""


def delay_proxy(port: int, rtt_ms: float) -> tuple[subprocess.Popen[str], int]:
    """A relay to 127.0.0.1:``port`` that holds each byte rtt_ms / 2 each way; (process, port)."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "_delay_proxy.py"), str(port), str(rtt_ms / 2)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "port":
        stop([proc])
        raise SystemExit(f"delay proxy did not start: {line!r}")
    return proc, int(line[1])


def port_of(addr: str) -> int:
    """The TCP port of ``addr`` (/ip4/127.0.0.1/tcp/P/p2p/ID)."""
    return int(addr.split("/tcp/")[1].split("/")[0])


def through(addr: str, port: int) -> str:
    """``addr`` (/ip4/127.0.0.1/tcp/P/p2p/ID) dialled at ``port`` instead: the relay's."""
    return re.sub(r"/tcp/\d+/", f"/tcp/{port}/", addr, count=1)


def raw_stream(
    nbytes: int, settings: str = "tuned", store: Path | None = None, rtt_ms: float = 0
) -> tuple[float, tuple[float, float]]:
    """A raw stream's MB/s and (receiver, sender) CPU seconds. ``settings`` "tuned": the node's
    host settings (defect 12's frames, defect 13's read-ahead, defect 14's window updates),
    "library": py-libp2p's own. With ``store``, the receiver also hashes every 1 MiB block and
    writes it to a BlockStore there. With ``rtt_ms``, it reaches the sender through a relay
    that delays every byte (bench/_delay_proxy.py)."""
    relays: list[subprocess.Popen[str]] = []
    server = subprocess.Popen(
        [sys.executable, "-c", RAW_SERVER, str(nbytes), settings],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        addr = server.stdout.readline().strip()
        if rtt_ms:
            relay, port = delay_proxy(port_of(addr), rtt_ms)
            relays.append(relay)
            addr = through(addr, port)
        server_cpu = cpu_s(server.pid)
        out = subprocess.run(
            [sys.executable, "-c", RAW_CLIENT, addr, settings, *([str(store)] if store else [])],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout.split()
        cpu = (float(out[2]), cpu_s(server.pid) - server_cpu)
        return int(out[0]) / 1e6 / float(out[1]), cpu
    finally:
        stop([server, *relays])
