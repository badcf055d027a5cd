"""Announcements: the topic validator's reasons, the holder table, and a real gossip round."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from cnode.auth import Identity, seal
from cnode.node.p2p import (
    ANNOUNCE_PAYLOAD_TYPE,
    AnnounceKind,
    Announcement,
    HolderTable,
    P2PSettings,
    RejectedMessage,
    announcement_validator,
    limits,
    open_p2p_node,
    trio_portal,
)
from cnode.node.p2p._gossip._repeat import HeldManifests
from cnode.storage import BlockStore, compute_cid

RUN = "run-a"
NOW = 1_800_000_000
ROOT = compute_cid(b"manifest")
HOLDER = Identity.generate()
STRANGER = Identity.generate()


def _payload(**changes: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "run": RUN,
        "kind": "hold",
        "counter": 1,
        "at": NOW,
        "cid": str(ROOT),
    }
    payload.update(changes)
    return {k: v for k, v in payload.items() if v is not None}


def _validator():  # type: ignore[no-untyped-def]
    return announcement_validator(RUN, lambda peer: peer == HOLDER.peer_id_str, clock=lambda: NOW)


def test_valid_hold_updates_table() -> None:
    opened = _validator().validate(
        seal(HOLDER, ANNOUNCE_PAYLOAD_TYPE, _payload(layers=["a", "b"])), HOLDER.peer_id_str
    )
    ann = Announcement.from_payload(opened.payload)
    assert ann.kind is AnnounceKind.HOLD and ann.layers == ("a", "b")
    table = HolderTable()
    table.apply(opened.signer, ann)
    assert table.holders(ROOT, layer="a") == {HOLDER.peer_id_str}
    assert table.holders(ROOT) == set()  # layers a and b only: not a holder of the whole
    table.apply(opened.signer, Announcement(RUN, AnnounceKind.DEPARTURE, 2, NOW))
    assert table.holders(ROOT, layer="a") == set()
    assert table.announced(ROOT) == {}


def test_partial_holder_holds_only_its_layers() -> None:
    table = HolderTable()
    full, partial = HOLDER.peer_id_str, STRANGER.peer_id_str
    table.apply(partial, Announcement(RUN, AnnounceKind.HOLD, 1, NOW, cid=ROOT, layers=("a",)))
    assert table.holders(ROOT) == set()
    assert table.holders(ROOT, layer="a") == {partial}
    assert table.holders(ROOT, layer="b") == set()
    table.apply(full, Announcement(RUN, AnnounceKind.HOLD, 1, NOW, cid=ROOT))
    assert table.holders(ROOT) == {full}
    assert table.holders(ROOT, layer="b") == {full}
    assert table.announced(ROOT) == {partial: frozenset({"a"}), full: None}
    # A signer's latest announcement replaces its earlier one, both ways.
    table.apply(partial, Announcement(RUN, AnnounceKind.HOLD, 2, NOW, cid=ROOT))
    table.apply(full, Announcement(RUN, AnnounceKind.HOLD, 2, NOW, cid=ROOT, layers=("b",)))
    assert table.holders(ROOT) == {partial}
    assert table.holders(ROOT, layer="b") == {partial, full}
    table.forget(partial)
    assert table.announced(ROOT) == {full: frozenset({"b"})}


def test_update_round_trip() -> None:
    ann = Announcement(RUN, AnnounceKind.UPDATE, 5, NOW, cid=ROOT, round=3)
    assert Announcement.from_payload(ann.to_payload()) == ann


def _signed(identity: Identity = HOLDER, payload_type: str = ANNOUNCE_PAYLOAD_TYPE, **kw: object):  # type: ignore[no-untyped-def]
    return seal(identity, payload_type, _payload(**kw))


@pytest.mark.parametrize(
    ("data", "source", "reason"),
    [
        (b"\x00" * (limits.MAX_ANNOUNCEMENT_SIZE + 1), HOLDER.peer_id_str, "oversized"),
        (b"not cbor at all", HOLDER.peer_id_str, "bad envelope"),
        (_signed()[:-1] + bytes([_signed()[-1] ^ 1]), HOLDER.peer_id_str, "bad envelope"),
        (_signed(payload_type="cnode/run-state/v1"), HOLDER.peer_id_str, "bad envelope"),
        (_signed(), STRANGER.peer_id_str, "signer is not the publisher"),
        (_signed(STRANGER), STRANGER.peer_id_str, "allowlist"),
        (_signed(run="other"), HOLDER.peer_id_str, "wrong run"),
        (_signed(kind="gift"), HOLDER.peer_id_str, "malformed: unknown kind"),
        (_signed(cid=None), HOLDER.peer_id_str, "malformed: hold needs a cid"),
        (_signed(cid="Qmnope"), HOLDER.peer_id_str, "malformed"),
        (_signed(kind="update"), HOLDER.peer_id_str, "malformed: round"),
        (_signed(layers=["x"] * (limits.MAX_ANNOUNCED_LAYERS + 1)), HOLDER.peer_id_str, "layer"),
        (_signed(extra=1), HOLDER.peer_id_str, "unknown fields"),
        (_signed(at=NOW - limits.MAX_ANNOUNCE_SKEW_S - 1), HOLDER.peer_id_str, "stale"),
    ],
    # Ids from the reason, not the (random) peer ids: pytest-xdist workers must collect alike.
    ids=lambda value: (
        {HOLDER.peer_id_str: "holder", STRANGER.peer_id_str: "stranger"}.get(value)
        if isinstance(value, str)
        else None
    ),
)
def test_validator_drops_with_reason(data: bytes, source: str, reason: str) -> None:
    with pytest.raises(RejectedMessage, match=reason):
        _validator().validate(data, source)


def test_replay_dropped() -> None:
    validator = _validator()
    data = _signed(counter=7)
    validator.validate(data, HOLDER.peer_id_str)
    with pytest.raises(RejectedMessage, match="replayed"):
        validator.validate(data, HOLDER.peer_id_str)
    with pytest.raises(RejectedMessage, match="replayed"):
        validator.validate(_signed(counter=6), HOLDER.peer_id_str)
    validator.validate(_signed(counter=8), HOLDER.peer_id_str)


async def _eventually(predicate, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


def test_gossip_builds_holder_table_and_drops_strangers(tmp_path: Path) -> None:
    """Three real hosts: the joiner keeps A (allowed) and drops C (not allowed), with a reason."""
    a_id, b_id, c_id = Identity.generate(), Identity.generate(), Identity.generate()
    allowed = {a_id.peer_id_str, b_id.peer_id_str}
    settings = P2PSettings(run_id=RUN)
    store = BlockStore(tmp_path / "blocks")

    async def main() -> list[Any]:
        with structlog.testing.capture_logs() as logs:
            async with (
                # A serves only B, and must still be able to announce (its own message
                # passes its own validator).
                open_p2p_node(a_id, store, settings, allow={b_id.peer_id_str}.__contains__) as a,
                open_p2p_node(b_id, store, settings, allow=allowed.__contains__) as b,
                open_p2p_node(c_id, store, settings, allow=lambda _p: True) as c,
            ):
                await b.connect(a.listen_addrs[0])
                await b.connect(c.listen_addrs[0])
                await trio.sleep(1.5)  # subscriptions exchanged, mesh formed
                await a.announce_hold(ROOT)
                await c.announce_hold(ROOT)
                await _eventually(lambda: b.holders(ROOT) == {a.peer_id}, "A in B's table")
                await trio.sleep(0.5)
                assert b.holders(ROOT) == {a.peer_id}
                await a.announce_departure()
                await _eventually(lambda: not b.holders(ROOT), "A gone from B's table")
        return logs

    logs = trio.run(main)
    drops = [e for e in logs if e["event"] == "pubsub_message_dropped"]
    assert any(
        "allowlist" in str(e["reason"]) and e["source"] == c_id.peer_id_str[-8:] for e in drops
    )


def test_late_peer_learns_existing_holders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """B starts after A announced: A's timed re-announcements tell B, partial layers kept.
    A stops re-announcing a manifest that left its store."""
    monkeypatch.setattr(limits, "REANNOUNCE_CHECK_S", 0.2)
    monkeypatch.setattr(limits, "REANNOUNCE_HOLD_S", 0.5)
    a_id, b_id = Identity.generate(), Identity.generate()
    settings = P2PSettings(run_id=RUN)
    store_a = BlockStore(tmp_path / "a")
    full_root = store_a.put_new(b"manifest")
    partial_root = store_a.put_new(b"another manifest")

    async def main() -> list[Any]:
        with structlog.testing.capture_logs() as logs:
            async with open_p2p_node(a_id, store_a, settings, allow=lambda _p: True) as a:
                await a.announce_hold(full_root)
                await a.announce_hold(partial_root, layers=["h.0.w"])
                await trio.sleep(0.2)  # published to nobody
                store_b = BlockStore(tmp_path / "b")
                async with open_p2p_node(b_id, store_b, settings, allow=lambda _p: True) as b:
                    assert not b.holders(full_root)
                    await b.connect(a.listen_addrs[0])
                    await _eventually(lambda: b.holders(full_root) == {a.peer_id}, "A, late")
                    await _eventually(
                        lambda: b.holders(partial_root, layer="h.0.w") == {a.peer_id}, "A, part"
                    )
                    assert b.holders(partial_root) == set()  # not a holder of the whole
                    assert b.holders(partial_root, layer="h.1.w") == set()
                    store_a.delete(partial_root)
                    await _eventually(
                        lambda: any(e["event"] == "hold_no_longer_announced" for e in logs),
                        "A stops announcing what it no longer holds",
                    )
        return logs

    logs = trio.run(main)
    # Nothing was refused as invalid. A re-announcement that gossip delivers after a newer one
    # is dropped as stale (seen on a loaded machine): that is the replay check working.
    dropped = [e for e in logs if e["event"] == "pubsub_message_dropped"]
    assert not [e for e in dropped if not str(e["reason"]).startswith("replayed: stale")]


def test_bridge_calls_node_from_asyncio(tmp_path: Path) -> None:
    """The coordinator's pattern: a node in a trio thread, called from an asyncio loop."""
    store = BlockStore(tmp_path / "blocks")
    ida, idb = Identity.generate(), Identity.generate()

    async def main() -> tuple[str, float]:
        lag = 0.0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal lag
            while not stop.is_set():
                start = time.monotonic()
                await asyncio.sleep(0.01)
                lag = max(lag, time.monotonic() - start - 0.01)

        tick = asyncio.create_task(ticker())
        try:
            async with (
                trio_portal(lambda: open_p2p_node(ida, store, P2PSettings(), allow=bool)) as pa,
                trio_portal(lambda: open_p2p_node(idb, store, P2PSettings(), allow=bool)) as pb,
            ):
                peer = await pb.call(pb.value.connect, pa.value.listen_addrs[0])
                await pa.call(
                    pa.value.publish, "/cnode/test/bridge", seal(ida, ANNOUNCE_PAYLOAD_TYPE, {})
                )
        finally:
            stop.set()
            await tick
        return peer, lag

    peer, lag = asyncio.run(main())
    assert peer == ida.peer_id_str
    assert lag < 0.5  # the asyncio loop never waited on trio work


def test_bridge_reports_trio_side_failure(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "blocks")
    bad = P2PSettings(listen=("not a multiaddr",))

    async def main() -> None:
        async with trio_portal(lambda: open_p2p_node(Identity.generate(), store, bad, allow=bool)):
            raise AssertionError("must not start")

    with pytest.raises(Exception, match="bad listen address"):
        asyncio.run(main())


def test_settings_from_config() -> None:
    from cnode.node._config import NodeConfig

    config = NodeConfig(listen="/ip4/127.0.0.1/tcp/4555", bootstrap=["/ip4/1.2.3.4/tcp/1/p2p/x"])
    settings = P2PSettings.from_config(config.with_changes(upload_rate_bytes_per_s=5), run_id="r")
    assert settings.listen == ("/ip4/127.0.0.1/tcp/4555",)
    assert settings.bootstrap == ("/ip4/1.2.3.4/tcp/1/p2p/x",)
    assert settings.upload_rate_bytes_per_s == 5 and settings.run_id == "r"


def test_holds_are_repeated_for_a_newcomer_not_on_a_timer_for_everyone() -> None:
    """Issue 41: a repeat is verified by every receiver, so a node repeats its holds when the
    topic gains a subscriber (or one comes back), and otherwise only every REANNOUNCE_HOLD_S."""
    held = HeldManifests()
    held.add(ROOT, None)
    t = 1000.0
    assert held.due({"a", "b"}, t)  # first look: everyone is new
    assert not held.due({"a", "b"}, t + 2)  # the same subscribers: nothing to say
    assert not held.due({"a"}, t + 4)  # one left: nothing to say either
    assert held.due({"a", "c"}, t + 6)  # a newcomer
    assert held.due({"a", "b", "c"}, t + 8)  # b came back: new again
    assert not held.due({"a", "b", "c"}, t + 8 + limits.REANNOUNCE_HOLD_S - 1)
    assert held.due({"a", "b", "c"}, t + 8 + limits.REANNOUNCE_HOLD_S)  # the safety net
    for i in range(limits.MAX_REANNOUNCED_HOLDS + 3):
        held.add(compute_cid(b"m%d" % i), ("h.0.w",))
    repeated = [root for root, _ in held]
    assert len(repeated) == limits.MAX_REANNOUNCED_HOLDS and ROOT not in repeated
