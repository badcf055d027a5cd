"""The Hugging Face path end to end: a checkpointer uploads each checkpoint with the real
huggingface_hub client (to the local FakeHub); when the whole swarm is gone, new nodes that no
peer can serve rebuild the coordinator's checkpoint from the Hub, verified slice by slice against
the manifest CID, and train on from it together.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cnode.node.train import StopReason
from tests.support.fixtures import hf_hub  # noqa: F401 (fixture)
from tests.support.hf_hub import FakeHub

from .swarm import Node, Swarm, final_states

pytestmark = pytest.mark.slow

REPO = "acme/cnode-t"


@pytest.fixture
def swarm(tmp_path: Path, hf_hub: FakeHub) -> Iterator[Swarm]:  # noqa: F811
    made = Swarm(tmp_path, ["a", "b", "c", "d"], min_participants=2, hf_endpoint=hf_hub.url)
    try:
        yield made
    finally:
        made.close()


def _train_and_upload(swarm: Swarm, hub: FakeHub, *, rounds: int) -> Node:
    """a (a checkpointer uploading to REPO) and b train ``rounds`` rounds and exit; return a."""
    swarm.hf_login("a", "alice", hub.add_user("alice", orgs=["acme"]))
    a = swarm.start("a", "--hf-repo", REPO, rounds=rounds, checkpointer=True)
    b = swarm.start("b", rounds=rounds)
    for node in (a, b):
        assert swarm.wait_exit(node, timeout=120) == 0, swarm.describe()
    return a


def test_new_nodes_catch_up_from_the_hub_when_no_peer_serves(
    swarm: Swarm,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    a = _train_and_upload(swarm, hf_hub, rounds=2)

    # Each checkpoint went to the Hub, and the coordinator names the commit of the last one.
    uploads = a.events("hub_uploaded")
    assert [u["round"] for u in uploads] == [1, 2], swarm.describe()
    record = swarm.run_state().checkpoint
    assert record.round == 2
    assert (record.hf_repo, record.hf_revision) == (REPO, uploads[-1]["revision"])
    assert record.manifest == a.events("round")[-1]["manifest"]

    # a and b are gone: c and d find no holder and fall back to the Hub. The first to have the
    # checkpoint announces it, so the other may take it from that peer instead.
    c = swarm.start("c", rounds=3)
    d = swarm.start("d", rounds=3)
    sources = {}
    for node, other in ((c, d), (d, c)):
        assert swarm.wait_exit(node, timeout=120) == 0, swarm.describe()
        (caught,) = node.events("caught_up")
        assert caught["manifest"] == record.manifest and caught["bytes"] > 0
        sources[node.name] = caught["source"]
        if caught["source"] == "hub":
            assert caught["hub"] == f"{REPO}@{record.hf_revision}"
        else:
            assert set(caught["bytes_per_holder"]) == {other.peer}, caught
    assert "hub" in sources.values(), sources
    finals = final_states([c, d])
    assert {r for r, _ in finals.values()} == {3}, finals
    assert len({cid for _, cid in finals.values()}) == 1, finals


def test_a_hub_serving_other_bytes_is_refused_loudly(
    swarm: Swarm,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    _train_and_upload(swarm, hf_hub, rounds=1)
    record = swarm.run_state().checkpoint
    weights = bytearray(hf_hub.file(REPO, "model.safetensors", record.hf_revision))
    weights[-1] ^= 0x01
    hf_hub.tamper(REPO, "model.safetensors", bytes(weights), record.hf_revision)

    c = swarm.start("c", rounds=2)
    assert swarm.wait_exit(c, timeout=120) == StopReason.UNREACHABLE.exit_code, swarm.describe()
    assert c.events("stopped")[-1]["stop_reason"] == "unreachable"
    reason = c.events("stopped")[-1]["reason"]
    assert "CatchUpError" in reason and "do not match the manifest's chunk" in reason, reason
    assert not c.events("round")
