"""Defects 21-24 of py-libp2p 0.8.1 (``node/p2p/_defects/_rpc.py``): per-RPC and per-read costs
of the pubsub receive path. As in test_defects.py, each has a canary (the library alone still
pays the cost) and a test that the workaround removes it; real hosts on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.abc import INetStream, ISubscriptionAPI
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.network.stream.net_stream import NetStream
from libp2p.peer import envelope as envelope_module
from libp2p.peer import peerstore as peerstore_module
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub import floodsub, gossipsub, pubsub, utils
from libp2p.pubsub.pubsub import Pubsub
from libp2p.stream_muxer.yamux import yamux
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils import varint

from cnode.node.p2p import _defects as defects
from cnode.node.p2p import limits
from cnode.node.p2p._defects import _rpc

LOOPBACK = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
TOPIC = "/cnode-test/rpc-cost"
MESSAGES = 200


def _original(module: Any, name: str) -> Any:
    current = getattr(module, name)
    return getattr(current, "__wrapped__", current)


def _library(monkeypatch: pytest.MonkeyPatch) -> None:
    """py-libp2p's own code for defects 21-24 (other tests' nodes mend them process-wide)."""
    check = _original(utils, "maybe_consume_signed_record")
    for module in (utils, pubsub, gossipsub, floodsub):
        monkeypatch.setattr(module, "maybe_consume_signed_record", check)
    build = _original(peerstore_module, "env_to_send_in_RPC")
    for module in (pubsub, gossipsub, floodsub):
        monkeypatch.setattr(module, "env_to_send_in_RPC", build)
    monkeypatch.setattr(
        pubsub, "read_varint_prefixed_bytes_limited", varint.read_varint_prefixed_bytes_limited
    )
    tune = _original(yamux.YamuxStream, "_auto_tune_and_send_window_update")
    monkeypatch.setattr(yamux.YamuxStream, "_auto_tune_and_send_window_update", tune)
    # Defect 14 mended, as in every cnode node: 22 is what it leaves.
    monkeypatch.setattr(yamux, "_yamux_release_on_read", lambda: False)


def _mend(monkeypatch: pytest.MonkeyPatch) -> None:
    _library(monkeypatch)
    for _ in range(2):  # idempotent: one wrapper each, not two
        defects.remember_sender_records()
        defects.window_updates_at_half_window()
        defects.buffer_pubsub_reads()
        defects.reuse_local_record()
    check: Any = utils.maybe_consume_signed_record
    assert not hasattr(check.__wrapped__, "__wrapped__")
    tune: Any = yamux.YamuxStream._auto_tune_and_send_window_update
    assert not hasattr(tune.__wrapped__, "__wrapped__")


def _host() -> Any:
    kp = create_new_key_pair()
    return new_host(key_pair=kp, sec_opt=defects.secure_transports(kp), muxer_opt=defects.muxers())


@asynccontextmanager
async def _pubsub_pair() -> AsyncIterator[tuple[Any, Pubsub, ISubscriptionAPI]]:
    """Two hosts with cnode's gossipsub settings, connected, both subscribed to TOPIC; yields
    the publisher's host, its pubsub and the receiver's subscription."""
    a, b = _host(), _host()
    ra, rb = defects.gossipsub_router(), defects.gossipsub_router()
    pa, pb = Pubsub(a, ra), Pubsub(b, rb)
    async with AsyncExitStack() as stack:
        for cm in (a.run(LOOPBACK), b.run(LOOPBACK)):
            await stack.enter_async_context(cm)
        for service in (pa, ra, pb, rb):
            await stack.enter_async_context(background_trio_service(service))
        await pa.wait_until_ready()
        await pb.wait_until_ready()
        with trio.fail_after(10):
            await b.connect(info_from_p2p_addr(a.get_addrs()[0]))
            sub = await pb.subscribe(TOPIC)
            await pa.subscribe(TOPIC)
            while b.get_id() not in pa.peer_topics.get(TOPIC, set()):
                await trio.sleep(0.02)
        yield a, pa, sub


async def _gossip(counters: dict[str, int], n: int = MESSAGES) -> None:
    """Publish ``n`` small messages from one host to another (paced under gossipsub's
    per-peer rate and queue), check all arrive intact and in order, and count in
    ``counters["addrs"]`` the publisher's address-list builds."""
    async with _pubsub_pair() as (a, pa, sub):
        get_addrs = a.get_addrs

        def counting_addrs() -> Any:
            counters["addrs"] += 1
            return get_addrs()

        a.get_addrs = counting_addrs
        sent = [b"message %d " % i + b"x" * (i % 300) for i in range(n)]
        got: list[bytes] = []

        async def receive() -> None:
            while len(got) < n:
                got.append((await sub.get()).data)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                for data in sent:
                    await pa.publish(TOPIC, data)
                    await trio.sleep(1 / (limits.GOSSIP_MAX_MSGS_PER_TOPIC_PER_S * 0.75))
        assert got == sent


def _count_gossip(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Signature checks of signed peer records, WINDOW_UPDATE frames, stream reads and address
    list builds while MESSAGES gossip messages go from one host to another."""
    counters = dict.fromkeys(("checks", "updates", "reads", "addrs"), 0)
    validate = envelope_module.Envelope.validate
    send_update = yamux.YamuxStream.send_window_update
    read = NetStream.read

    def counting_validate(self: Any, domain: str) -> None:
        counters["checks"] += 1
        validate(self, domain)

    async def counting_update(self: Any, increment: int, skip_lock: bool = False) -> None:
        counters["updates"] += 1
        await send_update(self, increment, skip_lock)

    async def counting_read(self: Any, n: int | None = None) -> bytes:
        counters["reads"] += 1
        return await read(self, n)

    monkeypatch.setattr(envelope_module.Envelope, "validate", counting_validate)
    monkeypatch.setattr(yamux.YamuxStream, "send_window_update", counting_update)
    monkeypatch.setattr(NetStream, "read", counting_read)
    trio.run(_gossip, counters)
    return counters


def test_per_rpc_costs_canary(monkeypatch: pytest.MonkeyPatch) -> None:
    """py-libp2p 0.8.1: per message, a signed-record check (defect 21), a window update
    (22), two or three stream reads (23) and an address list (24)."""
    _library(monkeypatch)
    counts = _count_gossip(monkeypatch)
    assert counts["checks"] >= MESSAGES  # measured: 210 (200 messages, 10 control RPCs)
    assert counts["updates"] >= MESSAGES // 2  # measured: 252
    assert counts["reads"] >= 2 * MESSAGES  # measured: 658
    assert counts["addrs"] >= MESSAGES  # measured: 200


def test_per_rpc_costs_mended(monkeypatch: pytest.MonkeyPatch) -> None:
    _mend(monkeypatch)
    counts = _count_gossip(monkeypatch)
    # Each host checks the other's record once (plus a re-check if the run is slow).
    assert counts["checks"] <= 8
    # 200 small frames are far under half a 256 KiB window: no update needed at all.
    assert counts["updates"] <= 4
    assert counts["reads"] <= MESSAGES * 3 // 2  # one per frame (and control RPC) at most
    assert counts["addrs"] <= 10  # one per LOCAL_RECORD_RECHECK_S of the run


# -- 21. the record cache is bounded and refuses what the library refuses -------------------------


def test_sender_record_cache_is_bounded_and_rechecks_new_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _mend(monkeypatch)
    monkeypatch.setattr(limits, "SENDER_RECORD_PEERS", 3)

    async def main() -> None:
        async with _pubsub_pair() as (a, _pa, _sub):
            record, _created = peerstore_module.env_to_send_in_RPC(a)
            msg = pubsub.rpc_pb2.RPC(senderRecord=record)
            check = utils.maybe_consume_signed_record
            assert check(msg, a, a.get_id())  # our own record, from ourselves: accepted
            other = _host()
            assert not check(msg, a, other.get_id())  # from another peer: refused, as the library
            assert not check(msg, a, other.get_id())  # and again (a refusal is not remembered)
            forged = pubsub.rpc_pb2.RPC(senderRecord=record[:-1] + bytes([record[-1] ^ 1]))
            assert not check(forged, a, a.get_id())  # other bytes: checked, refused
            for _ in range(5):
                peer = _host().get_id()
                check(msg, a, peer)
            seen = _rpc._accepted[a.get_peerstore()]
            assert len(seen) <= 3
            # A newer record stored since (identify, say): the library refuses the older bytes
            # ("older than the one stored"), and so does the cache, though it accepted them.
            assert check(msg, a, a.get_id())
            assert check(msg, a, a.get_id())  # remembered
            peerstore_module.issue_and_cache_local_record(a)
            newer = a.get_peerstore().get_local_record()
            assert newer is not None
            assert a.get_peerstore().consume_peer_record(newer, 7200)
            library: Any = _original(utils, "maybe_consume_signed_record")
            assert not library(msg, a, a.get_id())
            assert not check(msg, a, a.get_id())

    trio.run(main)


# -- 22. window updates: a transfer larger than the window, both ways, never stalls ---------------

BULK = 3 * yamux.DEFAULT_WINDOW_SIZE + 12345
BULK_PROTOCOL = TProtocol("/cnode-test/bulk-both-ways/1")


async def _both_ways() -> int:
    """BULK bytes each way on one stream at once, one side reading 1000 bytes at a time with
    pauses (its window closes on the sender), the other reading whatever is there."""
    server, client = _host(), _host()
    echoed: list[int] = []

    async def read_all(stream: INetStream, small: bool) -> int:
        got = 0
        reads = 0
        while got < BULK:
            got += len(await stream.read(1000 if small else None))
            reads += 1
            if small and reads % 200 == 0:
                await trio.sleep(0.02)  # a busy reader: the sender's window runs out
        return got

    async def handler(stream: INetStream) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.write, b"s" * BULK)
            echoed.append(await read_all(stream, small=True))

    server.set_stream_handler(BULK_PROTOCOL, handler)
    async with server.run(LOOPBACK), client.run(LOOPBACK):
        with trio.fail_after(60):
            info = info_from_p2p_addr(server.get_addrs()[0])
            await client.connect(info)
            stream = await client.new_stream(info.peer_id, [BULK_PROTOCOL])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.write, b"c" * BULK)
                got = await read_all(stream, small=False)
            while not echoed:
                await trio.sleep(0.01)
    assert echoed == [BULK]
    return got


def test_window_updates_at_half_window_never_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    _mend(monkeypatch)
    updates: list[int] = []
    send_update = yamux.YamuxStream.send_window_update

    async def counting_update(self: Any, increment: int, skip_lock: bool = False) -> None:
        updates.append(increment)
        await send_update(self, increment, skip_lock)

    monkeypatch.setattr(yamux.YamuxStream, "send_window_update", counting_update)
    assert trio.run(_both_ways) == BULK
    # Every update returns at least half a window: 2 x BULK bytes need at most this many.
    assert min(updates) >= yamux.DEFAULT_WINDOW_SIZE // 2
    assert len(updates) <= 2 * BULK // (yamux.DEFAULT_WINDOW_SIZE // 2) + 2


# -- 23. the pubsub frame reader: same frames, same errors ----------------------------------------


class _Chunks:
    """A stream that returns the given chunks, one per read (at most ``n`` bytes), then b""."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def read(self, n: int | None = None) -> bytes:
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if n is not None and len(chunk) > n:
            self.chunks.insert(0, chunk[n:])
            chunk = chunk[:n]
        return chunk


def test_read_ahead_cuts_the_same_frames_with_the_same_errors() -> None:
    frames = [b"", b"a", b"b" * 127, b"c" * 128, b"d" * 70_000]
    wire = b"".join(varint.encode_uvarint(len(f)) + f for f in frames)

    async def main() -> None:
        # Split at every awkward place: inside varints, inside bodies, several frames at once.
        for size in (1, 2, 3, 100, 129, len(wire)):
            stream = _Chunks(*(wire[i : i + size] for i in range(0, len(wire), size)))
            assert [await _rpc.read_frame_ahead(stream, 100_000) for _ in frames] == frames
            with pytest.raises(IncompleteReadError):
                await _rpc.read_frame_ahead(stream, 100_000)
        with pytest.raises(MessageTooLarge):
            await _rpc.read_frame_ahead(_Chunks(varint.encode_uvarint(101) + b"x"), 100)
        with pytest.raises(IncompleteReadError):
            await _rpc.read_frame_ahead(_Chunks(varint.encode_uvarint(10) + b"cut"), 100)
        with pytest.raises(varint.ParseError):
            await _rpc.read_frame_ahead(_Chunks(b"\xff" * 11), 100)
        with pytest.raises(ValueError, match="max_length"):
            await _rpc.read_frame_ahead(_Chunks(b"\x00"), 0)

    trio.run(main)
