"""What a node advertises in its join: listen addresses, wildcards, --announce-addr, privacy."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnode.auth import Identity
from cnode.node.train import TrainingConfigError, limits
from cnode.node.train.swarm._peers import advertised_addrs, discovery_poll_s

PEER = Identity.generate().peer_id_str


def test_a_specific_listen_address_is_advertised_with_the_peer_id() -> None:
    got = advertised_addrs(
        [f"/ip4/127.0.0.1/tcp/4101/p2p/{PEER}"], (), peer=PEER, allow_private=True
    )
    assert got == [f"/ip4/127.0.0.1/tcp/4101/p2p/{PEER}"]


def test_private_listen_addresses_are_left_out_of_a_public_run() -> None:
    assert advertised_addrs(["/ip4/127.0.0.1/tcp/4101"], (), peer=PEER, allow_private=False) == []


def test_a_wildcard_expands_to_interface_addresses_not_loopback_when_there_are_others() -> None:
    got = advertised_addrs(["/ip4/0.0.0.0/tcp/4001"], (), peer=PEER, allow_private=True)
    assert got and all(a.endswith(f"/tcp/4001/p2p/{PEER}") for a in got)
    assert "/ip4/0.0.0.0/" not in " ".join(got)
    if len(got) > 1:
        assert not any(a.startswith("/ip4/127.") for a in got)


def test_announce_addr_replaces_the_listen_addresses() -> None:
    got = advertised_addrs(
        ["/ip4/0.0.0.0/tcp/4001"], ("/ip4/93.184.216.34/tcp/40001",), peer=PEER, allow_private=False
    )
    assert got == [f"/ip4/93.184.216.34/tcp/40001/p2p/{PEER}"]


@pytest.mark.parametrize(
    ("announce", "words"),
    [
        ("/ip4/10.0.0.1/tcp/4001", "is a private address"),
        ("/ip4/93.184.216.34/udp/4001", "is not /ip4|ip6/ADDR/tcp/PORT"),
        ("not a multiaddr", "is not a multiaddr"),
        ("/ip4/0.0.0.0/tcp/4001", "cannot be dialed"),
    ],
)
def test_a_bad_announce_addr_is_a_clear_config_error(announce: str, words: str) -> None:
    with pytest.raises(TrainingConfigError, match="--announce-addr") as raised:
        advertised_addrs([], (announce,), peer=PEER, allow_private=False)
    assert words in str(raised.value)


def test_a_node_with_no_accepted_address_is_told_at_join_which_why_and_the_fix() -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        got = advertised_addrs(
            ["/ip4/127.0.0.1/tcp/4101", "/ip4/10.0.0.7/tcp/0", "/ip6/::1/tcp/4101"],
            (),
            peer=PEER,
            allow_private=False,
        )
    assert got == []
    (warning,) = [e for e in logs if e["event"] == "unreachable_at_join"]
    assert warning["log_level"] == "warning"
    assert warning["refused"] == {
        "/ip4/127.0.0.1/tcp/4101": "private or loopback address, and the run is public",
        "/ip4/10.0.0.7/tcp/0": "unspecified address or port 0: nobody can dial it",
        "/ip6/::1/tcp/4101": "not an /ip4/ADDR/tcp/PORT address (the form peers dial)",
    }
    assert "--announce-addr" in warning["fix"] and "allow_private_addrs" in warning["fix"]
    with capture_logs() as logs:  # an accepted address: nothing to say
        advertised_addrs(["/ip4/127.0.0.1/tcp/4101"], (), peer=PEER, allow_private=True)
    assert not [e for e in logs if e["event"] == "unreachable_at_join"]


def test_a_round_whose_members_cannot_be_dialed_is_said_by_name(tmp_path: Path) -> None:
    # A real libp2p node; the "members" listen nowhere (a closed port) or list no address.
    import trio
    from structlog.testing import capture_logs

    from cnode.node.p2p import P2PSettings, open_p2p_node
    from cnode.node.train.swarm._peers import PeerFinder
    from cnode.storage import BlockStore

    me = Identity.generate()
    silent, hidden = Identity.generate().peer_id_str, Identity.generate().peer_id_str
    addrs = {silent: [f"/ip4/127.0.0.1/tcp/9/p2p/{silent}"], hidden: []}

    async def main() -> dict[str, str]:
        settings = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",), run_id="r")
        async with open_p2p_node(me, BlockStore(tmp_path), settings, allow=bool) as node:
            finder = PeerFinder(node, refused=lambda _p: False)
            await finder.dial_listed(addrs)
            return finder.say_unreached(3, [me.peer_id_str, silent, hidden], addrs)

    with capture_logs() as logs:
        unreached = trio.run(main)
    assert set(unreached) == {silent, hidden}
    assert "lists no address" in unreached[hidden] and "tcp/9" in unreached[silent]
    (warning,) = [e for e in logs if e["event"] == "round_members_unreachable"]
    assert warning["round"] == 3 and warning["members"] == unreached


def test_discovery_reads_slow_down_with_the_swarm_so_its_total_stays_flat() -> None:
    # Every node reads the signed state in follow(); n nodes every 2 s made the coordinator's
    # reads grow with n (issue 27). 2 s per 4 listed peers keeps the swarm at ~2 reads a second.
    assert discovery_poll_s(0) == discovery_poll_s(4) == limits.DISCOVERY_POLL_S
    assert discovery_poll_s(16) == 4 * limits.DISCOVERY_POLL_S
    assert discovery_poll_s(1000) == limits.DISCOVERY_POLL_MAX_S
    for n in (4, 8, 16):
        assert n / discovery_poll_s(n) == 4 / limits.DISCOVERY_POLL_S
