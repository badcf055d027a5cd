"""Evidence uploads cannot hold the coordinator's evidence checks (issue 29): one member holds at
most its share (MAX_EVIDENCE_CHECKS_PER_PEER), an upload under the minimum rate or past its
deadline is cut with 408 too_slow, and a refusal names its true cause (busy, evidence_share).
Real coordinator, real sockets that trickle a body declared 100 MB; the deadlines are shortened
through ``ServeSettings.evidence_timing``."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from cnode.auth import Identity
from cnode.node.cli._coordinator import check_evidence
from cnode.node.coordinator import CoordinatorClient, limits
from cnode.node.coordinator.server import EvidenceTiming
from cnode.storage import compute_cid

from .conftest import Running, body, refused, run_config

RUN = "test-run"
HEADER = str(compute_cid(b"a partition result header", 0x71))
ARGS = {"round": 1, "partition": 0, "header": HEADER, "output": ""}
PATH = f"/v1/runs/{RUN}/rounds/1/partitions/0/evidence"
# How long an honest member's evidence may take to be answered here (its deadline in the test;
# the node's own is the round's verify window).
ANSWER_WITHIN_S = 15.0


@dataclass
class Trickle:
    """One upload on a raw socket: declares 100 MB, sends ``step`` bytes every 20 ms."""

    running: Running
    peer: Identity
    token: bytes
    step: int = 1
    answer: bytes = b""
    ended_after: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Trickle:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        where = urlsplit(self.running.url)
        envelope = body(self.peer, "wrong_result", ARGS, token=self.token)["envelope"]
        head = (
            f"POST {PATH} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Length: 100000000\r\n"
            f"X-Cnode-Request: {envelope}\r\n\r\n"
        )
        started = time.monotonic()
        with socket.create_connection((where.hostname, where.port), timeout=10) as s:
            s.sendall(head.encode())
            while not self.stop.is_set() and time.monotonic() - started < 60:
                try:
                    s.sendall(b"\x00" * self.step)
                except OSError:
                    break  # the server closed it
                readable, _, _ = select.select([s], [], [], 0.02)
                if readable:
                    try:
                        data = s.recv(65536)
                    except OSError:
                        data = b""
                    self.answer += data
                    if not data or b"\r\n\r\n" in self.answer:
                        break
        self.ended_after = time.monotonic() - started

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)


def _holding(running: Running, peer: Identity, n: int = 1) -> None:
    deadline = time.monotonic() + 10
    while running.server.evidence.slots.held(peer.peer_id_str) < n:
        assert time.monotonic() < deadline, "the upload never got its evidence check"
        time.sleep(0.01)


def _evidence(running: Running, peer: Identity, token: bytes, car: bytes) -> httpx.Response:
    envelope = body(peer, "wrong_result", ARGS, token=token)["envelope"]
    return httpx.post(
        running.url + PATH, content=car, headers={"X-Cnode-Request": envelope}, timeout=60
    )


def _round_with_a_result(running: Running, members: list[Identity]) -> dict[str, bytes]:
    """Round 1 published with ``members``; partition 0's aggregator recorded HEADER. Returns
    each member's access token."""

    async def main() -> None:
        clients = [
            CoordinatorClient(running.url, run=RUN, coordinator=running.peer_id, identity=p)
            for p in members
        ]
        for c in clients:
            await c.join()
            await c.join_round()
        for c, p in zip(clients, members, strict=True):
            await c.ready(1, header=str(compute_cid(p.peer_id_str.encode(), 0x71)))
        with trio.fail_after(10):
            info = await clients[0].wait_members(1)
        by_id = {p.peer_id_str: c for p, c in zip(members, clients, strict=True)}
        aggregator = by_id[info.aggregators[0]]
        await aggregator.result(1, partition=0, header=HEADER)
        for c in clients:
            await c.aclose()

    trio.run(main)
    tokens = {}
    for p in members:
        with running.client(p) as c:
            tokens[p.peer_id_str] = c.join().token
    return tokens


@pytest.fixture
def members(peers: list[Identity]) -> list[Identity]:
    return peers[:3]


def _serve(serve: Any, peers: list[Identity], timing: EvidenceTiming) -> Running:
    config = run_config(peers, partitioned="auto", min_participants=3)
    running: Running = serve(config, evidence_checker=check_evidence, evidence_timing=timing)
    return running


@pytest.fixture
def trickles() -> Iterator[list[Trickle]]:
    started: list[Trickle] = []
    yield started
    for t in started:
        t.close()


def test_one_member_holds_its_share_and_refusals_name_the_cause(
    serve: Any, peers: list[Identity], members: list[Identity], trickles: list[Trickle]
) -> None:
    # Windows longer than the test: the trickles hold their checks until closed.
    timing = EvidenceTiming(queue_wait_s=0.3, retry_after_s=1.0, window_s=120.0)
    running = _serve(serve, peers, timing)
    tokens = _round_with_a_result(running, members)
    slow, honest, other = members
    first = Trickle(running, slow, tokens[slow.peer_id_str]).start()
    trickles.append(first)
    _holding(running, slow)
    # Its second upload is refused at once, naming its share, not "too many requests".
    second = _evidence(running, slow, tokens[slow.peer_id_str], b"x")
    refused(second, 429, "evidence_share", "MAX_EVIDENCE_CHECKS_PER_PEER")
    assert int(second.headers["Retry-After"]) >= 1
    # Another member's evidence gets the other check and is answered (the CAR is malformed: the
    # real checker says so).
    started = time.monotonic()
    refused(
        _evidence(running, honest, tokens[honest.peer_id_str], b"no CAR"), 400, "bad_evidence", ""
    )
    assert time.monotonic() - started < ANSWER_WITHIN_S
    # A second member holding the other check: all are in use, and the refusal says so.
    trickles.append(Trickle(running, other, tokens[other.peer_id_str]).start())
    _holding(running, other)
    busy = _evidence(running, honest, tokens[honest.peer_id_str], b"no CAR")
    refused(busy, 429, "busy", "MAX_EVIDENCE_CHECKS")
    assert int(busy.headers["Retry-After"]) >= 1
    first.close()  # a check frees up (the upload ends cut short): the next evidence is answered
    deadline = time.monotonic() + ANSWER_WITHIN_S
    while running.server.evidence.slots.held(slow.peer_id_str):
        assert time.monotonic() < deadline, "a closed upload kept its check"
        time.sleep(0.01)
    refused(
        _evidence(running, honest, tokens[honest.peer_id_str], b"no CAR"), 400, "bad_evidence", ""
    )


def test_trickling_uploads_are_cut_and_other_evidence_is_answered(
    serve: Any, peers: list[Identity], members: list[Identity], trickles: list[Trickle]
) -> None:
    timing = EvidenceTiming(queue_wait_s=ANSWER_WITHIN_S, window_s=0.3, min_rate_bps=64 * 1024)
    running = _serve(serve, peers, timing)
    tokens = _round_with_a_result(running, members)
    slow, honest, other = members
    for peer in (slow, other):  # two members, one trickle each: both checks held
        trickles.append(Trickle(running, peer, tokens[peer.peer_id_str]).start())
    _holding(running, slow)
    _holding(running, other)
    started = time.monotonic()
    answer = _evidence(running, honest, tokens[honest.peer_id_str], b"no CAR")
    refused(answer, 400, "bad_evidence", "")
    assert time.monotonic() - started < ANSWER_WITHIN_S
    for t in trickles:
        t.thread.join(ANSWER_WITHIN_S)  # type: ignore[union-attr]
        assert t.ended_after is not None, "a trickle was never cut"
        assert b" 408 " in t.answer and b"too_slow" in t.answer, t.answer[:300]
        assert b"EVIDENCE_MIN_RATE_BPS" in t.answer
    assert running.server.evidence.slots.held(slow.peer_id_str) == 0


def test_an_upload_past_its_deadline_is_cut(
    serve: Any, peers: list[Identity], members: list[Identity], trickles: list[Trickle]
) -> None:
    # Fast enough for every window, never done: the body deadline cuts it.
    timing = EvidenceTiming(window_s=0.2, min_rate_bps=1024, body_deadline_s=1.0)
    running = _serve(serve, peers, timing)
    tokens = _round_with_a_result(running, members)
    steady = Trickle(running, members[0], tokens[members[0].peer_id_str], step=4096).start()
    trickles.append(steady)
    steady.thread.join(ANSWER_WITHIN_S)  # type: ignore[union-attr]
    assert b" 408 " in steady.answer and b"EVIDENCE_BODY_DEADLINE_S" in steady.answer
    assert steady.ended_after is not None and steady.ended_after < ANSWER_WITHIN_S
    assert limits.EVIDENCE_BODY_DEADLINE_S >= 60  # production: far above the test's second
