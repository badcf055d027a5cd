"""Peer addresses in joins and round records, the agreed input set of a round, and a client that
waits out a coordinator restart — against a real coordinator (trio client, real SQLite)."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from cnode.auth import Identity
from cnode.node.coordinator import (
    CoordinatorClient,
    CoordinatorRejected,
    CoordinatorUnavailable,
    NetworkConfig,
    RoundStatus,
    RunConfig,
)
from cnode.node.coordinator import limits as coordinator_limits
from cnode.node.coordinator.server import ServeSettings
from cnode.node.p2p import P2PSettings, open_p2p_node
from cnode.storage import BlockStore, compute_cid

from .conftest import Running, body, post, refused, run_config, start_server


def _client(running: Running, peer: Identity, **kw: Any) -> CoordinatorClient:
    return CoordinatorClient(
        running.url, run=running.server.run, coordinator=running.peer_id, identity=peer, **kw
    )


def _private(config: RunConfig) -> RunConfig:
    return replace(config, network=NetworkConfig(allow_private_addrs=True))


def _header(peer: Identity) -> str:
    return str(compute_cid(f"header of {peer.peer_id_str}".encode(), 0x71))


def test_round_records_carry_each_peers_checked_addresses(
    serve: Any, peers: Any, tmp_path: Path
) -> None:
    """Only addresses the coordinator dialed back are stored and handed out: a's real libp2p
    node answers, b's address (an unrouted LAN one) does not, so b is outbound-only and nobody
    is told to dial it (specs/coordinator.md#reachability)."""
    running = serve(_private(run_config(peers, min_participants=2)))
    a, b = peers[0], peers[1]

    async def main() -> None:
        settings = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))
        store = BlockStore(tmp_path / "blocks")
        async with open_p2p_node(a, store, settings, allow=lambda _peer: True) as node:
            port = node.listen_addrs[0].split("/")[4]
            mine = f"/ip4/127.0.0.1/tcp/{port}/p2p/{a.peer_id_str}"
            ca, cb = _client(running, a), _client(running, b)
            joined_a = await ca.join(addrs=[f"/ip4/127.0.0.1/tcp/{port}"] * 2)
            assert (joined_a.reachability, joined_a.reachable) == ("public", [mine])
            joined_b = await cb.join(addrs=[f"/ip4/10.1.2.3/tcp/4102/p2p/{b.peer_id_str}"])
            assert (joined_b.reachability, joined_b.reachable) == ("outbound-only", [])
            assert await ca.join_round() == 1
            # Before the list is published, the record already names the joined peers' addresses.
            info = await cb.round_info(1)
            assert info.addrs == {a.peer_id_str: [mine]}
            assert await cb.join_round() == 1
            await ca.ready(1, header=_header(a))
            await cb.ready(1, header=_header(b))
            with trio.fail_after(10):
                listed = await ca.wait_members(1)
            assert listed.addrs == {a.peer_id_str: [mine]}
            # The run state carries them too (its last round), signed by the coordinator.
            state = await ca.run_state()
            assert state.last_round is not None and state.last_round.addrs == listed.addrs

    trio.run(main)


@pytest.mark.parametrize(
    ("addrs", "words"),
    [
        (["/ip4/999.1.1.1/tcp/1"], "is not a multiaddr"),
        (["/ip4/1.2.3.4/udp/1"], "is not /ip4|ip6/ADDR/tcp/PORT"),
        (["/ip4/0.0.0.0/tcp/4001"], "cannot be dialed"),
        (["/ip4/1.2.3.4/tcp/0"], "cannot be dialed"),
        (["/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWSomeoneElse"], "is not a multiaddr"),
        (["/ip4/10.0.0.7/tcp/4001"], "is a private address"),
        (["/ip4/127.0.0.1/tcp/4001"], "is a private address"),
        (["/ip4/1.2.3.4/tcp/4001"] * (coordinator_limits.MAX_PEER_ADDRS + 1), "MAX_PEER_ADDRS"),
        (["/ip4/1.2.3.4/tcp/4001/" + "x" * coordinator_limits.MAX_ADDR_CHARS], "MAX_ADDR_CHARS"),
        ("/ip4/1.2.3.4/tcp/4001", "must be a list"),
        ([42], "must be a string"),
    ],
)
def test_a_bad_address_refuses_the_join_and_changes_nothing(
    serve: Any, peers: Any, addrs: Any, words: str
) -> None:
    running = serve(run_config(peers))  # a run on the internet: no private addresses
    before = running.state()
    response = post(running, "join", body(peers[0], "join", {"addrs": addrs}))
    refused(response, 400, "bad_addr", words)
    assert running.state() == before


def test_another_peers_id_in_an_address_is_refused(serve: Any, peers: Any) -> None:
    running = serve(run_config(peers))
    other = peers[1].peer_id_str
    response = post(
        running, "join", body(peers[0], "join", {"addrs": [f"/ip4/1.2.3.4/tcp/1/p2p/{other}"]})
    )
    refused(response, 400, "bad_addr", "names another peer")


def test_public_addresses_are_accepted_in_a_public_run(serve: Any, peers: Any) -> None:
    """Accepted (no bad_addr), dialed back, and not handed out when nothing answers there (this
    sandbox reaches no internet): the joiner learns it is outbound-only."""
    running = serve(run_config(peers))
    a = peers[0]

    async def main() -> None:
        ca = _client(running, a)
        joined = await ca.join(
            addrs=["/ip4/93.184.216.34/tcp/4001", "/ip6/2606:4700::1111/tcp/4001"]
        )
        assert (joined.reachability, joined.reachable) == ("outbound-only", [])
        await ca.join_round()
        info = await ca.round_info(1)
        assert a.peer_id_str not in info.addrs

    trio.run(main)


def _publish(running: Running, members: list[Identity]) -> list[CoordinatorClient]:
    clients = [_client(running, p) for p in members]

    async def main() -> None:
        for c in clients:
            await c.join()
            assert await c.join_round() == 1
        for c, p in zip(clients, members, strict=True):
            await c.ready(1, header=_header(p))
        with trio.fail_after(10):
            await clients[0].wait_members(1)

    trio.run(main)
    return clients


def test_the_agreed_set_is_what_a_strict_majority_of_reporters_holds(
    serve: Any, peers: Any
) -> None:
    a, b, c, d = peers
    running = serve(run_config(peers, min_participants=4))
    ca, cb, cc, cd = _publish(running, peers)

    async def main() -> None:
        # d is cut off: it got nothing, and nobody got its update.
        await ca.collected(1, missing=[d.peer_id_str])
        await cb.collected(1, missing=[d.peer_id_str])
        record = await ca.round_info(1)
        assert record.status is RoundStatus.PUBLISHED and record.agreed is None
        await cc.collected(1, missing=[d.peer_id_str])
        await cd.collected(1, missing=[a.peer_id_str, b.peer_id_str, c.peer_id_str])
        with trio.fail_after(10):
            agreed = await cd.wait_agreed(1)
        assert agreed.agreed == sorted([a.peer_id_str, b.peer_id_str, c.peer_id_str])
        assert agreed.excluded == {
            d.peer_id_str: "update held by 1 of the round's 4 members (4 reported)"
        }
        # The decision is final: a late report changes nothing.
        await cd.collected(1, missing=[])
        assert (await ca.round_info(1)).agreed == agreed.agreed

    trio.run(main)


def test_at_the_collect_deadline_silent_members_count_as_not_holding(
    serve: Any, peers: Any
) -> None:
    a, b = peers[0], peers[1]
    # late_max_s: without a majority of reports the decision waits at most this past the
    # deadline (specs/coordinator.md#pace); short here, for the suite's time.
    running = serve(run_config(peers, min_participants=2, collect_timeout_s=1.0, late_max_s=1.0))
    ca, _cb = _publish(running, [a, b])

    async def main() -> None:
        await ca.collected(1, missing=[])  # b crashed after ready and never reports
        with trio.fail_after(10):
            agreed = await ca.wait_agreed(1)
        # a holds both updates, but one report of two members is no majority: a lone reporter
        # cannot make the round (it might be the one cut off from everyone else).
        assert agreed.agreed == []
        why = agreed.excluded[a.peer_id_str]
        assert why == "update held by 1 of the round's 2 members (1 reported)"

    trio.run(main)


def test_collected_reports_are_checked(serve: Any, peers: Any) -> None:
    a, b = peers[0], peers[1]
    running = serve(run_config(peers, min_participants=2))
    ca, _cb = _publish(running, [a, b])
    outsider = _client(running, peers[2])

    async def main() -> None:
        with pytest.raises(CoordinatorRejected, match="not in round 1"):
            await ca.collected(1, missing=[peers[3].peer_id_str])
        await outsider.join()
        with pytest.raises(CoordinatorRejected, match="is not a member of round 1"):
            await outsider.collected(1, missing=[])
        with pytest.raises(CoordinatorRejected, match="has no published list"):
            await ca.collected(7, missing=[])
        assert (await ca.round_info(1)).status is RoundStatus.PUBLISHED  # nothing decided

    trio.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_client_waits_out_a_restart_on_the_same_database(
    peers: Any, coordinator_key: Identity, tmp_path: Path
) -> None:
    port = _free_port()
    config = replace(run_config(peers, min_participants=1), coordinator=coordinator_key.peer_id_str)
    settings = ServeSettings(
        config=config, db=tmp_path / "c.db", identity=coordinator_key, port=port
    )
    running = [start_server(settings)]
    a = peers[0]

    async def main() -> None:
        async with _client(running[0], a) as ca:
            await ca.join()
            version = (await ca.run_state()).version
            running[0].stop()  # the coordinator goes away ...

            async def restart() -> None:
                await trio.sleep(1.5)  # ... and comes back on the same database and port
                running[0] = await trio.to_thread.run_sync(start_server, settings)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(restart)
                with trio.fail_after(30):
                    assert await ca.join_round() == 1  # sent while the coordinator was down
            # Nothing acknowledged was lost, and the state version went on, never back.
            assert (await ca.run_state()).version > version

    try:
        trio.run(main)
    finally:
        running[0].stop()


def test_the_client_gives_up_with_a_clear_error_after_its_outage_limit(peers: Any) -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there

    async def main() -> None:
        async with CoordinatorClient(
            url, run="test-run", coordinator=peers[1].peer_id_str, identity=peers[0], outage_s=1.0
        ) as client:
            with pytest.raises(CoordinatorUnavailable, match="gave up after 1 s of retries"):
                with trio.fail_after(10):
                    await client.run_state()

    trio.run(main)
