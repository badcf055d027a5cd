"""hf_whoami with the real huggingface_hub client against the local FakeHub, and HF bindings."""

import dag_cbor
import pytest
from huggingface_hub import HfApi

from cnode.auth import (
    BadSignature,
    BindingError,
    HFLoginError,
    HFLoginReason,
    Identity,
    WrongSigner,
    hf_whoami,
    make_hf_binding,
    seal,
    verify_hf_binding,
)
from tests.support.fixtures import dead_endpoint, hf_hub  # noqa: F401
from tests.support.hf_hub import FakeHub


def test_whoami_returns_user_and_orgs(hf_hub: FakeHub) -> None:  # noqa: F811
    token = hf_hub.add_user("alice", orgs=["acme", "lab"])
    account = hf_whoami(token, hf_hub.url)
    assert account.username == "alice"
    assert account.orgs == ["acme", "lab"]
    assert hf_hub.requests == [("GET", "/api/whoami-v2", "alice")]


def test_fake_hub_speaks_to_the_plain_client(hf_hub: FakeHub) -> None:  # noqa: F811
    token = hf_hub.add_user("bob")
    assert HfApi(endpoint=hf_hub.url).whoami(token=token)["name"] == "bob"


def test_whoami_uses_hf_endpoint_env(hf_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    token = hf_hub.add_user("carol")
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    assert hf_whoami(token).username == "carol"


def test_bad_token(hf_hub: FakeHub) -> None:  # noqa: F811
    hf_hub.add_user("alice")
    bad = "hf_ThisTokenDoesNotExist0123456789"
    with pytest.raises(HFLoginError, match=r"rejected the token \(HTTP 401\)") as info:
        hf_whoami(bad, hf_hub.url)
    assert info.value.reason is HFLoginReason.BAD_TOKEN
    assert bad not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_revoked_token(hf_hub: FakeHub) -> None:  # noqa: F811
    token = hf_hub.add_user("alice")
    assert hf_whoami(token, hf_hub.url).username == "alice"
    hf_hub.revoke(token)
    with pytest.raises(HFLoginError, match="invalid, expired or revoked") as info:
        hf_whoami(token, hf_hub.url)
    assert info.value.reason is HFLoginReason.BAD_TOKEN
    assert token not in str(info.value)


def test_unreachable_endpoint(dead_endpoint: str) -> None:  # noqa: F811
    token = "hf_SomeTokenThatMustNotLeak0123456"
    with pytest.raises(HFLoginError, match=f"cannot reach the Hugging Face Hub at {dead_endpoint}"):
        hf_whoami(token, dead_endpoint)


def test_server_error_and_empty_token(hf_hub: FakeHub) -> None:  # noqa: F811
    token = hf_hub.add_user("alice")
    hf_hub.failures[("GET", "/api/whoami-v2")] = 500
    with pytest.raises(HFLoginError, match="answered whoami with HTTP 500") as info:
        hf_whoami(token, hf_hub.url)
    assert info.value.reason is HFLoginReason.BAD_RESPONSE
    with pytest.raises(HFLoginError, match="empty or contains spaces"):
        hf_whoami("   ", hf_hub.url)


def test_binding_roundtrip() -> None:
    identity = Identity.generate()
    data = make_hf_binding(identity, "alice", 1_800_000_000)
    bound = verify_hf_binding(data, expected_peer=identity.peer_id_str)
    assert (bound.peer_id, bound.username, bound.at) == (
        identity.peer_id_str,
        "alice",
        1_800_000_000,
    )


def test_binding_refusals() -> None:
    identity, other = Identity.generate(), Identity.generate()
    data = make_hf_binding(identity, "alice", 1)
    with pytest.raises(WrongSigner):
        verify_hf_binding(data, expected_peer=other.peer_id_str)
    fields = dag_cbor.decode(data)
    assert isinstance(fields, dict)
    fields["payload"] = {**fields["payload"], "username": "mallory"}  # type: ignore[dict-item]
    with pytest.raises(BadSignature):
        verify_hf_binding(dag_cbor.encode(fields))
    # Well signed by `other`, but claiming `identity`'s peer id.
    stolen = seal(
        other, "cnode/hf-binding/v1", {"at": 1, "peer": identity.peer_id_str, "username": "a"}
    )
    with pytest.raises(BindingError, match="is signed by"):
        verify_hf_binding(stolen)
    extra = seal(identity, "cnode/hf-binding/v1", {"at": 1, "peer": identity.peer_id_str})
    with pytest.raises(BindingError, match="fields"):
        verify_hf_binding(extra)
    with pytest.raises(BindingError, match="exceeds MAX_BINDING_SIZE"):
        verify_hf_binding(b"\x00" * 5000)
