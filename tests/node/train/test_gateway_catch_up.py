"""Gateways in a run: a training node serves a trustless gateway beside libp2p (``--gateway``);
when the swarm is gone, a new node that no peer can serve catches up from the run config's
``gateways`` (tried after peers, before the Hub), every block verified; a second one (with
``--fetch-gateway``) joins it, and they train on from the checkpoint together.

The second starts once the first has caught up: two nodes joining the same round within the
same second may miss each other's update header (gossipsub mesh not formed yet; seen here with
the near-instant gateway catch-up), which is the swarm's matter, not the gateway's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import Procs, procs

from .swarm import Swarm, _free_port, final_states

pytestmark = pytest.mark.slow


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    gateway = f"http://127.0.0.1:{_free_port()}"  # where a's store is served later
    made = Swarm(tmp_path, ["a", "b", "c", "d"], min_participants=2, gateways=[gateway])
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Procs]:
    with procs(tmp_path) as p:
        yield p


def test_new_nodes_catch_up_from_a_gateway_when_no_peer_serves(
    swarm: Swarm, running: Procs
) -> None:
    port = _free_port()
    a = swarm.start("a", "--gateway", f"127.0.0.1:{port}", rounds=2, checkpointer=True)
    b = swarm.start("b", rounds=2)
    swarm.wait("a's gateway", lambda: bool(a.events("gateway")), timeout=60)
    url = a.events("gateway")[0]["url"]
    assert url == f"http://127.0.0.1:{port}"
    probe = httpx.get(f"{url}/ipfs/bafkqaaa?format=raw", timeout=10)
    assert probe.status_code == 200  # the spec's probe: a trustless gateway answers here
    for node in (a, b):
        assert swarm.wait_exit(node, timeout=180) == 0, swarm.describe()
    record = swarm.run_state().checkpoint
    assert record.round == 2

    # a and b are gone. a's store is served again by a holder whose libp2p address nobody
    # knows: only its gateway is reachable, so c and d's peers cannot serve the checkpoint.
    (gateway,) = swarm.gateways
    holder, _addr = running.holder(a.home, "--open", "--gateway", gateway.removeprefix("http://"))
    assert holder.wait_line("gateway ") == f"gateway {gateway}"
    # c and d start together: both catch up in the same second and join the same round, the
    # case where, before the round's agreed input set, they missed each other's header.
    c = swarm.start("c", rounds=3)  # its gateway comes from the run config
    d = swarm.start("d", "--fetch-gateway", gateway, rounds=3)  # peers first, then this
    for node in (c, d):
        assert swarm.wait_exit(node, timeout=180) == 0, swarm.describe()
    caught_up = [n.events("caught_up")[0] for n in (c, d)]
    assert all(e["manifest"] == record.manifest for e in caught_up), caught_up
    # The first to catch up had only the gateway; the other may have had it from that one.
    assert all(e["source"] in ("peers", "gateways") for e in caught_up), caught_up
    # The first of them (by time: c or d) fetched from the gateway, the other, asking peers
    # first, may have taken all of it from that one.
    from_gateway = sorted((e for e in caught_up if e["source"] == "gateways"), key=lambda e: e["t"])
    assert from_gateway and from_gateway[0]["bytes_per_holder"][f"gateway:{gateway}"] > 0
    finals = final_states([c, d])
    assert {r for r, _ in finals.values()} == {3}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals
