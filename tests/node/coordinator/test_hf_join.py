"""Joining with an HF account: the real huggingface_hub client against a local Hub look-alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from cnode.auth import Identity, make_hf_binding
from cnode.node.coordinator import AccessConfig, CoordinatorRejected, RunConfig
from tests.support.hf_hub import FakeHub

from .conftest import Running


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as h:
        yield h


@pytest.fixture
def running(serve: Any, hub: FakeHub) -> Running:
    config = RunConfig(run="test-run", access=AccessConfig(users=["alice"], orgs=["acme"]))
    r: Running = serve(config, hf_endpoint=hub.url)
    return r


def binding(peer: Identity, username: str) -> bytes:
    return make_hf_binding(peer, username, int(time.time()))


def refused_join(running: Running, peer: Identity, hf_binding: bytes, token: str) -> Any:
    before = running.state()
    with running.client(peer) as c, pytest.raises(CoordinatorRejected) as err:
        c.join(hf_binding=hf_binding, hf_token=token)
    assert running.state() == before
    return err.value


def test_allowlisted_user_and_org_member_join(running: Running, hub: FakeHub) -> None:
    alice, bob = Identity.generate(), Identity.generate()
    alice_token = hub.add_user("alice")
    bob_token = hub.add_user("bob", orgs=["acme"])
    with running.client(alice) as c:
        joined = c.join(hf_binding=binding(alice, "alice"), hf_token=alice_token)
    assert joined.username == "alice" and joined.peer == alice.peer_id_str
    assert joined.expires_at_ms > time.time() * 1000
    with running.client(bob) as c:
        assert c.join(hf_binding=binding(bob, "bob"), hf_token=bob_token).username == "bob"
    assert all(alice_token not in str(r) for r in hub.requests)  # the hub never records tokens


def test_hf_join_refusals(running: Running, hub: FakeHub) -> None:
    alice, carol, mallory = Identity.generate(), Identity.generate(), Identity.generate()
    alice_token = hub.add_user("alice")
    carol_token = hub.add_user("carol", orgs=["other"])
    err = refused_join(running, carol, binding(carol, "carol"), carol_token)
    assert err.code == "not_allowlisted" and "'carol'" in err.message
    # Mallory claims to be alice but holds carol's token.
    err = refused_join(running, mallory, binding(mallory, "alice"), carol_token)
    assert err.code == "hf_user_mismatch" and "'carol'" in err.message
    # A binding made by another peer.
    err = refused_join(running, mallory, binding(alice, "alice"), alice_token)
    assert err.code == "bad_binding"
    hub.revoke(alice_token)
    err = refused_join(running, alice, binding(alice, "alice"), alice_token)
    assert (
        err.status == 401 and err.code == "hf_login_failed" and "rejected the token" in err.message
    )
    assert alice_token not in err.message


def test_banned_user_cannot_come_back_with_a_new_peer_id(running: Running, hub: FakeHub) -> None:
    alice, alice2 = Identity.generate(), Identity.generate()
    token = hub.add_user("alice")
    with running.client(alice) as c:
        c.join(hf_binding=binding(alice, "alice"), hf_token=token)
    with running.admin() as admin:
        admin.ban(alice.peer_id_str, "poisoned round 4")
    err = refused_join(running, alice2, binding(alice2, "alice"), token)
    assert err.code == "banned" and "user 'alice'" in err.message and "poisoned" in err.message
