"""Gateways in a run: a training node serves a trustless gateway beside libp2p (``--gateway``);
when the swarm is gone, new nodes that no peer can serve catch up from a gateway
(``--fetch-gateway``, tried after peers and before the Hub), every block verified, and train on
from the checkpoint together."""

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
    made = Swarm(tmp_path, ["a", "b", "c", "d"], min_participants=2)
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
    holder, _addr = running.holder(a.home, "--open", "--gateway", "127.0.0.1:0")
    gateway = holder.wait_line("gateway ").split(" ", 1)[1]
    c = swarm.start("c", "--fetch-gateway", gateway, rounds=3)
    d = swarm.start("d", "--fetch-gateway", gateway, rounds=3)
    sources = {}
    for node in (c, d):
        assert swarm.wait_exit(node, timeout=180) == 0, swarm.describe()
        (caught,) = node.events("caught_up")
        assert caught["manifest"] == record.manifest and caught["bytes"] > 0
        sources[node.name] = caught["source"]
        if caught["source"] == "gateways":
            assert f"gateway:{gateway}" in caught["bytes_per_holder"], caught
    assert "gateways" in sources.values(), sources
    finals = final_states([c, d])
    assert {r for r, _ in finals.values()} == {3}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals
