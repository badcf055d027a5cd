"""Dial-back and the aggregation roles of outbound-only members (specs/coordinator.md
#reachability): only a libp2p listener counts as reachable, and mixed rounds are aggregated by
public members only, the same on every read of the round."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from cnode.auth import Identity
from cnode.node.coordinator._bans._bans import BanBook
from cnode.node.coordinator._http._dialback import MULTISTREAM_HEADER, Reachability, dial_back
from cnode.node.coordinator._rounds._partitions import PartitionRules
from cnode.node.train.exchange._relay import relay_duty

from .conftest import run_config


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (as a proxy or middlebox may)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not done.is_set():
            try:
                accepted.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        done.set()
        thread.join(timeout=5)
        for conn in accepted:
            conn.close()
        sock.close()


def test_a_port_that_accepts_but_speaks_no_libp2p_is_not_reachable(silent_listener: int) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    free = closed.getsockname()[1]
    closed.close()  # nothing listens there: refused at once
    addrs = [f"/ip4/127.0.0.1/tcp/{silent_listener}/p2p/x", f"/ip4/127.0.0.1/tcp/{free}/p2p/x"]
    assert asyncio.run(dial_back(addrs, timeout_s=0.5)) == []
    assert Reachability.of([]) is Reachability.OUTBOUND_ONLY
    assert MULTISTREAM_HEADER == b"\x13/multistream/1.0.0\n"


def test_mixed_rounds_are_aggregated_by_public_members_only() -> None:
    five = [Identity.generate() for _ in range(5)]
    rules = PartitionRules(run_config(five), BanBook())
    members = sorted(p.peer_id_str for p in five)
    public = frozenset(members[:2])
    assigned = rules.assign(1, members, 5, public)
    assert len(assigned) == 5 and set(assigned) == public  # several partitions each
    assert abs(assigned.count(members[0]) - assigned.count(members[1])) <= 1
    # All public, or none: every member aggregates, as before.
    assert sorted(rules.assign(1, members, 5, frozenset(members))) == members
    assert sorted(rules.assign(1, members, 5, frozenset())) == members
    assert rules.assign(1, members, 0, public) == []


def test_each_outbound_only_member_has_one_re_serving_public_member() -> None:
    members = ["p1", "p2", "n1", "n2", "n3"]
    addrs = {"p1": ["/ip4/1.2.3.4/tcp/1"], "p2": ["/ip4/1.2.3.5/tcp/1"]}
    duties = {m: relay_duty(members, addrs, m) for m in members}
    assert duties["n1"] == duties["n2"] == duties["n3"] == []
    assert sorted(duties["p1"] + duties["p2"]) == ["n1", "n2", "n3"]
    assert abs(len(duties["p1"]) - len(duties["p2"])) <= 1
