from typing import Any

import dag_cbor
import pytest

from cnode.auth import (
    EncodeError,
    Identity,
    PeerIdError,
    TokenError,
    TokenReason,
    issue_access_token,
    seal,
    verify_access_token,
)

NOW = 1_800_000_000


@pytest.fixture(scope="module")
def coordinator() -> Identity:
    return Identity.generate()


@pytest.fixture(scope="module")
def peer() -> Identity:
    return Identity.generate()


def _token(coordinator: Identity, peer: Identity, **over: object) -> bytes:
    args: dict = {"peer_id": peer.peer_id_str, "username": "alice", "run": "run-1"}
    args["expires_at"] = NOW + 60
    args.update(over)
    return issue_access_token(coordinator, **args)


def test_issue_and_verify(coordinator: Identity, peer: Identity) -> None:
    token = _token(coordinator, peer)
    got = verify_access_token(
        token, coordinator_peer_id=coordinator.peer_id_str, run="run-1", now=NOW
    )
    assert (got.peer_id, got.username, got.run, got.expires_at) == (
        peer.peer_id_str,
        "alice",
        "run-1",
        NOW + 60,
    )


def _refused(token: bytes, coordinator: Identity, reason: TokenReason, match: str, **kw: object):
    args: dict = {"coordinator_peer_id": coordinator.peer_id_str, "run": "run-1", "now": NOW}
    args.update(kw)
    with pytest.raises(TokenError, match=match) as info:
        verify_access_token(token, **args)
    assert info.value.reason is reason


def test_expired(coordinator: Identity, peer: Identity) -> None:
    token = _token(coordinator, peer)
    _refused(token, coordinator, TokenReason.EXPIRED, "expired at", now=NOW + 60)
    _refused(token, coordinator, TokenReason.EXPIRED, "expired", now=NOW + 3600.5)


def test_wrong_run(coordinator: Identity, peer: Identity) -> None:
    token = _token(coordinator, peer)
    _refused(token, coordinator, TokenReason.WRONG_RUN, "for run 'run-1', not 'run-2'", run="run-2")


def test_wrong_coordinator(coordinator: Identity, peer: Identity) -> None:
    # The peer issues itself a token: well signed, but not by the pinned coordinator.
    token = _token(peer, peer)
    _refused(token, coordinator, TokenReason.WRONG_COORDINATOR, "not issued by this run's")


def test_forged(coordinator: Identity, peer: Identity) -> None:
    fields: Any = dag_cbor.decode(_token(coordinator, peer))
    payload = dict(fields["payload"])
    payload["expires_at"] = NOW + 10**9  # extend the lifetime without the key
    fields["payload"] = payload
    _refused(dag_cbor.encode(fields), coordinator, TokenReason.FORGED, "forged access token")


def test_malformed(coordinator: Identity, peer: Identity) -> None:
    _refused(b"\x00garbage", coordinator, TokenReason.MALFORMED, "malformed access token")
    _refused(b"\x00" * 5000, coordinator, TokenReason.MALFORMED, "exceeds MAX_TOKEN_SIZE")
    other = seal(coordinator, "cnode/announce/v1", {"peer": peer.peer_id_str})
    _refused(other, coordinator, TokenReason.MALFORMED, "not an access token")
    missing = seal(coordinator, "cnode/access-token/v1", {"peer": peer.peer_id_str, "run": "x"})
    _refused(missing, coordinator, TokenReason.MALFORMED, "fields")
    bad_time = seal(
        coordinator,
        "cnode/access-token/v1",
        {"peer": peer.peer_id_str, "run": "run-1", "username": "a", "expires_at": "soon"},
    )
    _refused(bad_time, coordinator, TokenReason.MALFORMED, "expires_at must be an integer")


def test_issue_refuses_bad_arguments(coordinator: Identity, peer: Identity) -> None:
    with pytest.raises(PeerIdError):
        _token(coordinator, peer, peer_id="not-a-peer")
    with pytest.raises(EncodeError, match="username"):
        _token(coordinator, peer, username="")
    with pytest.raises(EncodeError, match="expires_at"):
        _token(coordinator, peer, expires_at=1.5)
