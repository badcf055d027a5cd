"""Bad input: each is a 4xx with a clear JSON error, and the signed state is unchanged."""

from __future__ import annotations

import base64
import time
from typing import Any

import dag_cbor
import httpx
import pytest

from cnode.auth import Identity, issue_access_token, seal
from cnode.node.coordinator import (
    PEER_ONLY_USERNAME,
    BadRunState,
    CoordinatorRejected,
    SyncCoordinatorClient,
    limits,
    verify_state_envelope,
)
from cnode.node.coordinator._wire._protocol import b64encode

from .conftest import Running, body, post, refused, run_config


@pytest.fixture
def running(serve: Any, peers: list[Identity]) -> Running:
    r: Running = serve(run_config(peers[:3], min_participants=2))
    return r


def joined_token(running: Running, peer: Identity) -> bytes:
    with running.client(peer) as c:
        return c.join().token


def test_malformed_json_and_bad_shapes(running: Running, peers: list[Identity]) -> None:
    before = running.state()
    refused(post(running, "join", content=b"{not json"), 400, "malformed_json", "not JSON")
    refused(post(running, "join", [1, 2]), 400, "bad_request", '{"envelope"')
    refused(post(running, "join", {"envelope": "***"}), 400, "bad_request", "base64")
    refused(
        post(running, "join", {"envelope": b64encode(b"\xa0garbage")}),
        400,
        "bad_envelope",
        "request envelope",
    )
    refused(post(running, "ready", body(peers[0], "join")), 400, "wrong_op", "'join'")
    refused(
        post(running, "join", body(peers[0], "join", run="other")),
        400,
        "run_mismatch",
        "another run",
    )
    assert running.state() == before


def test_unknown_run(running: Running, peers: list[Identity]) -> None:
    before = running.state()
    refused(
        post(running, "join", body(peers[0], "join", run="nope"), run="nope"),
        404,
        "unknown_run",
        "'nope'",
    )
    refused(httpx.get(f"{running.url}/v1/runs/nope/state"), 404, "unknown_run", "serves run")
    assert running.state() == before


def test_bad_expired_forged_and_foreign_tokens(running: Running, peers: list[Identity]) -> None:
    token = joined_token(running, peers[0])
    before = running.state()
    refused(
        post(running, "join_round", body(peers[0], "join_round")),
        401,
        "bad_token",
        "needs the access token",
    )
    refused(
        post(running, "join_round", body(peers[0], "join_round", token=b"junk")),
        401,
        "bad_token",
        "access token",
    )
    expired = issue_access_token(
        running.key,
        peer_id=peers[0].peer_id_str,
        username=PEER_ONLY_USERNAME,
        run="test-run",
        expires_at=int(time.time()) - 10,
    )
    refused(
        post(running, "join_round", body(peers[0], "join_round", token=expired)),
        401,
        "bad_token",
        "access token",
    )
    forged = issue_access_token(
        Identity.generate(),
        peer_id=peers[0].peer_id_str,
        username=PEER_ONLY_USERNAME,
        run="test-run",
        expires_at=int(time.time()) + 600,
    )
    refused(
        post(running, "join_round", body(peers[0], "join_round", token=forged)),
        401,
        "bad_token",
        "access token",
    )
    refused(
        post(running, "join_round", body(peers[1], "join_round", token=token)),
        401,
        "bad_token",
        "another peer",
    )
    assert running.state() == before


def test_wrong_key_signatures(running: Running, peers: list[Identity]) -> None:
    before = running.state()
    # A valid signature, but not by an admin key.
    refused(
        post(running, "admin", body(peers[0], "admin", {"action": "allowlist.ls"})),
        403,
        "not_admin",
        "not an admin",
    )
    # A forged request: the admin's peer id as signer over a non-admin's signature.
    mine: Any = dag_cbor.decode(
        base64.b64decode(body(peers[0], "admin", {"action": "allowlist.ls"})["envelope"])
    )
    admin: Any = dag_cbor.decode(
        base64.b64decode(
            body(
                running.key, "admin", {"action": "ban", "peer": peers[1].peer_id_str, "reason": "x"}
            )["envelope"]
        )
    )
    forged = dict(admin, sig=mine["sig"])
    refused(
        post(running, "admin", {"envelope": b64encode(dag_cbor.encode(forged))}),
        401,
        "bad_signature",
        "does not verify",
    )
    assert running.state() == before
    # The client refuses state not signed by the pinned coordinator.
    other = Identity.generate()
    with (
        SyncCoordinatorClient(
            running.url, run="test-run", coordinator=other.peer_id_str, identity=peers[0]
        ) as c,
        pytest.raises(BadRunState),
    ):
        c.run_state()
    state = seal(other, "cnode/run-state/v1", {"kind": "run", "run": "test-run"})
    with pytest.raises(BadRunState, match="pinned coordinator"):
        verify_state_envelope(state, run="test-run", coordinator=running.peer_id)
    with running.admin() as c, pytest.raises(BadRunState, match="no signed state"):
        c._core.signed({"state": {"phase": "Training"}})  # a reply with the signature missing


def test_replayed_request(running: Running, peers: list[Identity]) -> None:
    token = joined_token(running, peers[0])
    request = body(peers[0], "join_round", token=token)
    assert post(running, "join_round", request).json() == {"ok": True, "round": 1}
    before = running.state()
    refused(post(running, "join_round", request), 409, "replayed", "not above the last one")
    leave = body(peers[0], "leave", {"round": 1}, token=token, counter=5)  # an old counter
    refused(post(running, "leave", leave), 409, "replayed", "counter 5")
    assert running.state() == before


def test_join_refused_for_unlisted_and_banned(running: Running, peers: list[Identity]) -> None:
    stranger = Identity.generate()
    before = running.state()
    with running.client(stranger) as c, pytest.raises(CoordinatorRejected) as err:
        c.join()
    assert err.value.status == 403 and err.value.code == "not_allowlisted"
    assert stranger.peer_id_str in err.value.message
    assert running.state() == before
    with running.admin() as admin:
        admin.ban(peers[2].peer_id_str, "sent NaN updates")
    before = running.state()
    with running.client(peers[2]) as c, pytest.raises(CoordinatorRejected) as err:
        c.join()
    assert err.value.code == "banned" and "sent NaN updates" in err.value.message
    assert running.state() == before


def test_manifest_for_a_past_round(serve: Any, peers: list[Identity]) -> None:
    from cnode.storage import compute_cid

    running = serve(run_config(peers[:1], min_participants=1))
    with running.client(peers[0]) as c:
        c.join()
    token = joined_token(running, peers[0])
    for n in (1, 2):
        assert (
            post(running, "join_round", body(peers[0], "join_round", token=token)).json()["round"]
            == n
        )
        post(running, "ready", body(peers[0], "ready", {"round": n}, token=token))
    cid = str(compute_cid(b"round 2"))
    ok = post(
        running,
        "checkpoint",
        body(peers[0], "checkpoint", {"epoch": 0, "round": 2, "manifest": cid}, token=token),
    )
    assert ok.status_code == 200, ok.text
    before = running.state()
    old = str(compute_cid(b"round 1"))
    refused(
        post(
            running,
            "checkpoint",
            body(peers[0], "checkpoint", {"epoch": 0, "round": 1, "manifest": old}, token=token),
        ),
        409,
        "stale_round",
        "not newer than the current checkpoint",
    )
    refused(
        post(
            running,
            "checkpoint",
            body(peers[0], "checkpoint", {"epoch": 0, "round": 2, "manifest": "nope"}, token=token),
        ),
        400,
        "bad_cid",
        "not a CID",
    )
    assert running.state() == before


def test_oversize_body(running: Running, peers: list[Identity]) -> None:
    before = running.state()
    big = b'{"envelope": "' + b"A" * (limits.MAX_REQUEST_BYTES + 10) + b'"}'
    refused(post(running, "join", content=big), 413, "too_large", "MAX_REQUEST_BYTES")

    def chunks():  # no Content-Length: aiohttp's own cap must answer in JSON too
        yield big

    r = httpx.post(f"{running.url}/v1/runs/test-run/join", content=chunks())
    assert r.status_code == 413 and r.json()["error"] == "too_large"
    assert running.state() == before


def test_join_flood_is_rate_limited(running: Running, peers: list[Identity]) -> None:
    codes = []
    for _ in range(limits.JOIN_BURST):
        codes.append(post(running, "join", body(peers[0], "join")).status_code)
    assert codes == [200] * limits.JOIN_BURST
    before = running.state()
    for _ in range(5):
        r = post(running, "join", body(peers[0], "join"))
        refused(r, 429, "rate_limited", "too many requests")
        assert int(r.headers["Retry-After"]) >= 1
    # Another peer is not affected by this one's flood.
    assert post(running, "join", body(peers[1], "join")).status_code == 200
    assert running.state()["version"] == before["version"] + 1


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("after=x", "after must be an integer"),
        ("after=-2", "after must be >= -1"),
        ("after=1_0", "after must be an integer"),
        ("after=%D9%A3", "after must be an integer"),  # an Arabic-Indic digit: int() takes it
        (f"after={2**63}", "after must be at most MAX_ROUND"),
        (f"after={10**30}", "after must be at most MAX_ROUND"),
        ("after=" + "9" * 5000, "after must be at most MAX_ROUND"),
        ("limit=0", "limit must be >= 1"),
        (f"limit={limits.MAX_CHECKPOINT_PAGE + 1}", "limit must be at most MAX_CHECKPOINT_PAGE"),
    ],
)
def test_bad_checkpoint_history_queries(running: Running, query: str, words: str) -> None:
    before = running.state()
    run = running.server.run
    answer = httpx.get(f"{running.url}/v1/runs/{run}/checkpoints?{query}")
    refused(answer, 400, "bad_request", words)
    assert running.state() == before
