"""Bounds on every number and every nesting that enters over HTTP (issue 29): what gave a 500
(OverflowError from SQLite, RecursionError from the JSON parser) is a 400 naming the field and
its limit, refused before any query; the signed state is unchanged."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cnode.auth import Identity
from cnode.node.coordinator import limits
from cnode.node.coordinator._wire._protocol import Until

from .conftest import Running, body, post, refused, run_config

RUN = "test-run"
HUGE = [2**63, 10**30, limits.MAX_ROUND + 1]


@pytest.fixture
def running(serve: Any, peers: list[Identity]) -> Running:
    r: Running = serve(run_config(peers[:3], min_participants=2))
    return r


@pytest.fixture
def token(running: Running, peers: list[Identity]) -> bytes:
    with running.client(peers[0]) as c:
        return c.join().token


@pytest.mark.parametrize("n", [*HUGE, "9" * 5000])
def test_huge_rounds_in_paths_and_queries(running: Running, n: object) -> None:
    before = running.state()
    base = f"{running.url}/v1/runs/{RUN}"
    for url in (f"{base}/rounds/{n}", f"{base}/rounds/{n}/scores"):
        refused(httpx.get(url), 400, "bad_request", "round must be at most MAX_ROUND")
    refused(
        httpx.get(f"{base}/checkpoints", params={"after": str(n)}),
        400,
        "bad_request",
        "after must be at most MAX_ROUND",
    )
    refused(
        httpx.post(f"{base}/rounds/{n}/partitions/0/evidence", content=b""),
        400,
        "bad_request",
        "round must be at most MAX_ROUND",
    )
    refused(
        httpx.post(f"{base}/rounds/1/partitions/{n}/evidence", content=b""),
        400,
        "bad_request",
        "partition must be at most MAX_ROUND_MEMBERS",
    )
    assert running.state() == before


# (op, args, the words of the refusal): each once gave a 500 from SQLite.
SIGNED = [
    ("ready", {"round": 2**63}, "'round' must be at most MAX_ROUND"),
    ("leave", {"round": 10**18}, "'round' must be at most MAX_ROUND"),
    ("collected", {"round": 2**63, "missing": []}, "'round' must be at most MAX_ROUND"),
    ("result", {"round": 2**63, "partition": 0, "header": "x"}, "MAX_ROUND"),
    ("result", {"round": 1, "partition": 2**63, "header": "x"}, "MAX_ROUND_MEMBERS"),
    ("checked", {"round": 2**63, "wrong": []}, "'round' must be at most MAX_ROUND"),
    ("checked", {"round": 1, "wrong": [2**63]}, "MAX_ROUND_MEMBERS"),
    ("score", {"round": 2**63, "record": ""}, "'round' must be at most MAX_ROUND"),
    ("report", {"kind": "round", "round": 2**63, "loss": 1.0}, "MAX_ROUND"),
    ("report", {"kind": "round", "round": 1, "loss": 1e308}, "MAX_REPORT_NUMBER"),
    (
        "report",
        {
            "kind": "catch_up",
            "round": 1,
            "manifest": None,
            "seconds": 1.0,
            "bytes": 2**63,
            "source": "peers",
            "bytes_per_holder": {},
        },
        "'bytes' must be finite, >= 0 and at most MAX_REPORT_NUMBER",
    ),
    (
        "ban_evidence",
        {"peer": "x", "round": 2**63, "kind": "outlier", "reason": "r", "update_cid": None},
        "'round' must be at most MAX_ROUND",
    ),
    (
        "checkpoint",
        {"epoch": 0, "round": 2**63, "manifest": "x"},
        "'round' must be at most MAX_ROUND",
    ),
    ("checkpoint", {"epoch": 2**63, "round": 1, "manifest": "x"}, "MAX_EPOCH"),
]


@pytest.mark.parametrize(("op", "args", "words"), SIGNED)
def test_huge_numbers_in_signed_requests(
    running: Running, peers: list[Identity], token: bytes, op: str, args: dict, words: str
) -> None:
    before = running.state()
    refused(post(running, op, body(peers[0], op, args, token=token)), 400, "bad_request", words)
    assert running.state() == before


def test_huge_counter_and_admin_log_page(running: Running, peers: list[Identity]) -> None:
    before = running.state()
    refused(
        post(running, "join", body(peers[0], "join", counter=2**63)),
        400,
        "bad_request",
        "'counter' must be at most MAX_COUNTER",
    )
    log = body(running.key, "admin", {"action": "log", "after": 2**63})
    refused(post(running, "admin", log), 400, "bad_request", "'after' must be at most MAX_LOG_SEQ")
    assert running.state() == before


def test_deep_json_is_a_400_not_a_recursion_error(
    running: Running, peers: list[Identity], token: bytes
) -> None:
    before = running.state()
    refused(post(running, "join", content=b"[" * 50_000), 400, "too_deep", "MAX_JSON_DEPTH")
    deep = b'{"envelope": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    refused(post(running, "join", content=deep), 400, "too_deep", "MAX_JSON_DEPTH")
    evidence = {"peer": peers[1].peer_id_str, "round": 1, "kind": "outlier", "reason": "r"}
    evidence["update_cid"] = None
    for figures in ("[" * 4000, '{"a":' * 400 + "1" + "}" * 400):
        report = body(peers[0], "ban_evidence", evidence | {"figures": figures}, token=token)
        refused(post(running, "ban_evidence", report), 400, "too_deep", "MAX_JSON_DEPTH")
    assert running.state() == before
    assert httpx.get(f"{running.url}/v1/health").json()["ok"] is True


def test_long_polls_of_arbitrary_rounds_keep_nothing(running: Running) -> None:
    base = f"{running.url}/v1/runs/{RUN}/rounds"
    server = running.server
    with httpx.Client() as http:
        for n in range(10, 60):  # far past the current round: a plain sleep, no event kept
            for until in Until:
                answer = http.get(f"{base}/{n}", params={"wait": "0.001", "until": until})
                assert answer.status_code == 200, answer.text
        assert not any(server.waits.events.values())
        # The next round is waited on with an event (set and dropped once it is published).
        assert http.get(f"{base}/2", params={"wait": "0.001"}).status_code == 200
    assert list(server.waits.events["published"]) == [2]
    assert limits.MAX_POLLED_ROUNDS >= 2 * limits.ROUND_CACHE
