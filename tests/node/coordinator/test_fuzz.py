"""A seeded, bounded fuzz of every HTTP route of the coordinator and every signed request type
(issue 29): random and extreme values (huge and negative ints, floats, number-like strings, deep
nesting, wrong types, long strings, unicode) in paths, query strings, bodies and the fields of
requests signed by real members with valid tokens. Every answer is a 2xx, or a 4xx whose JSON
names a registered error code and says what was wrong; never a 5xx; the server stays up.

``CNODE_FUZZ_SEED`` and ``CNODE_FUZZ_CASES`` replay or widen a run (defaults: seed 29, 600
cases; a few seconds on one core).
"""

from __future__ import annotations

import base64
import os
import random
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
import trio

from cnode.auth import EncodeError, Identity, seal
from cnode.node.cli._coordinator import check_evidence, check_reputation
from cnode.node.coordinator import ERRORS, REQUEST_TYPE, CoordinatorClient, ErrorCode, limits
from cnode.node.coordinator._wire._protocol import Op, b64encode
from cnode.storage import compute_cid

from .conftest import Running, run_config

SEED = int(os.environ.get("CNODE_FUZZ_SEED", "29"))
CASES = int(os.environ.get("CNODE_FUZZ_CASES", "600"))
RUN = "test-run"
MEMBERS = 16  # spreads the signed cases over 16 rate buckets: most reach the handlers
CID = str(compute_cid(b"fuzz", 0x71))

INTS = [0, 1, -1, 2, 3, 2**31 - 1, 2**31, 2**53, 2**53 + 1, 2**63 - 1, 2**63, -(2**63)]
INTS += [2**64 - 1, -(2**64), limits.MAX_ROUND, limits.MAX_ROUND + 1, limits.MAX_COUNTER + 1]
FLOATS = [0.0, -0.0, 0.5, -1.5, 1e308, -1e308, 5e-324, 1.7976931348623157e308]
TEXTS = ["", " ", "NaN", "inf", "-inf", "-1", "1e999", "0x10", "1_0", "\u0663", "\x00", "🙂" * 200]
TEXTS += ["x" * 513, "x" * 5000, "<script>alert(1)</script>", "../../etc/passwd", CID]
TEXTS += ["javascript:alert(1)", "12D3KooW", "reputation below the ban bound in 1 of 1 rounds"]
PATH_NUMBERS = ["1", "0", "-1", str(2**63), str(2**64), "9" * 30, "9" * 5000, "1.5", "nan"]
PATH_NUMBERS += ["inf", "\u0663", "1_0", " 1", "0x10", "abc", "%00", "1e3", "+1", "-0"]
QUERY_VALUES = ["0", "0.01", "-1", "nan", "inf", "-inf", "1e309", "11", "x", "", str(2**63)]
QUERY_VALUES += ["9" * 400, "published", "agreed", "results", "\u0663", "1_0", "256", "257"]


def _nested(depth: int, leaf: Any, as_map: bool) -> Any:
    for _ in range(depth):
        leaf = {"a": leaf} if as_map else [leaf]
    return leaf


def _value(rng: random.Random, ids: list[str]) -> Any:
    """One random or extreme value of any type the request fields could meet."""
    kind = rng.randrange(9)
    if kind <= 2:
        return rng.choice(INTS)
    if kind == 3:
        return rng.choice(FLOATS)
    if kind == 4:
        return rng.choice(TEXTS + ids)
    if kind == 5:
        return rng.choice([True, False, None, b"", b"\xff" * 64])
    if kind == 6:  # nesting up to the envelope's own bound (auth: MAX_CBOR_DEPTH 32)
        return _nested(rng.randrange(1, 34), rng.choice([0, "x", None]), rng.random() < 0.5)
    if kind == 7:
        return rng.choice([[], {}, [0] * 10_000, ["x"] * 1000, {"a": 1}, [1, 2, 3], [-1], [2**63]])
    return "x" * rng.choice([600, 50_000, 70_000])


def _valid_args(op: Op, rng: random.Random, ids: list[str]) -> dict[str, Any]:
    """Arguments of ``op`` as a member sends them (before mutation)."""
    peer = rng.choice(ids)
    figures = {"rounds": [1], "reputations": [-1875], "scores": []}
    catch_up = {
        "kind": "catch_up",
        "round": 1,
        "manifest": CID,
        "seconds": 1.0,
        "bytes": 10,
        "source": "peers",
        "bytes_per_holder": {peer: 10},
    }
    args: dict[Op, dict[str, Any]] = {
        Op.JOIN: {"addrs": ["/ip4/127.0.0.1/tcp/4001"]},
        Op.JOIN_ROUND: {},
        Op.READY: {"round": 1, "header": CID},
        Op.LEAVE: {"round": 1},
        Op.COLLECTED: {"round": 1, "missing": [peer]},
        Op.RESULT: {"round": 1, "partition": 0, "header": CID},
        Op.SCORE: {"round": 1, "record": b64encode(b"\xa0")},
        Op.CHECKED: {"round": 1, "wrong": [0]},
        Op.CHECKPOINT: {"epoch": 0, "round": 1, "manifest": CID},
        Op.BAN_EVIDENCE: {
            "peer": peer,
            "round": 1,
            "kind": rng.choice(["reputation", "outlier", "rejected", "wrong_score", "bogus"]),
            "reason": "reputation below the ban bound in 1 of 1 rounds",
            "update_cid": CID,
            "figures": figures,
        },
        Op.ADMIN: {
            "action": rng.choice(["allowlist.ls", "log", "allowlist.add", "unban"]),
            "kind": "peer",
            "value": "x",
            "peer": "x",
            "after": 0,
            "limit": 10,
        },
        Op.REPORT: rng.choice([{"kind": "round", "round": 1, "loss": 1.0, "holds": CID}, catch_up]),
        Op.WRONG_RESULT: {"round": 1, "partition": 0, "header": CID, "output": ""},
    }
    return dict(args[op])


def _mutate(args: dict[str, Any], rng: random.Random, ids: list[str]) -> Any:
    if rng.random() < 0.08:
        return _value(rng, ids)  # args that are no map at all
    for _ in range(rng.randrange(1, 4)):
        keys = list(args) or ["round"]
        key = rng.choice([*keys, "extra", "round", "partition"])
        roll = rng.random()
        if roll < 0.15:
            args.pop(key, None)
        elif roll < 0.3 and isinstance(args.get(key), dict | list) and args[key]:
            inner = args[key]
            if isinstance(inner, dict):
                inner[rng.choice(list(inner))] = _value(rng, ids)
            else:
                inner[rng.randrange(len(inner))] = _value(rng, ids)
        else:
            args[key] = _value(rng, ids)
    return args


class Fuzzer:
    def __init__(self, running: Running, members: list[Identity], tokens: dict[str, bytes]):
        self.running = running
        self.members = members
        self.tokens = tokens
        self.ids = [m.peer_id_str for m in members]
        self.rng = random.Random(SEED)
        self.http = httpx.Client(base_url=running.url, timeout=30)
        self.counter = time.time_ns() // 1000
        self.statuses: Counter[int] = Counter()
        self.codes: Counter[str] = Counter()
        self.unsendable = 0

    def envelope(self, op: Op, args: Any) -> str | None:
        rng = self.rng
        signer = rng.choice(self.members + [self.running.key] * 2)  # the admin now and then
        self.counter += 1
        payload: dict[str, Any] = {"run": RUN, "op": str(op), "counter": self.counter, "args": args}
        if op is Op.ADMIN and signer is self.running.key and isinstance(args, dict):
            args["peer"] = "x"  # the admin never bans the members this fuzz needs
        if signer is not self.running.key:
            payload["token"] = self.tokens[signer.peer_id_str]
        roll = rng.random()
        if roll < 0.05:
            payload["counter"] = rng.choice(INTS + FLOATS + TEXTS[:3])
        elif roll < 0.08:
            payload["run"] = rng.choice(TEXTS)
        elif roll < 0.11:
            payload["op"] = rng.choice([*map(str, Op), *TEXTS[:4]])
        elif roll < 0.15:
            payload["token"] = _value(rng, self.ids)
        elif roll < 0.17:
            payload.pop(rng.choice(list(payload)))
        try:
            return b64encode(seal(signer, REQUEST_TYPE, payload))
        except EncodeError:  # a value DAG-CBOR cannot carry (an int past 64 bits)
            self.unsendable += 1
            return None

    def signed_case(self) -> httpx.Response | None:
        rng = self.rng
        op = rng.choice(list(Op))
        args: Any = _valid_args(op, rng, self.ids)
        if rng.random() < 0.85:  # the rest stay valid: they reach the deepest checks
            args = _mutate(args, rng, self.ids)
        envelope = self.envelope(op, args)
        if envelope is None:
            return None
        if op is Op.WRONG_RESULT:
            n, p = ("1", "0") if rng.random() < 0.5 else (rng.choice(PATH_NUMBERS),) * 2
            body = rng.choice([b"", b"no CAR", os.urandom(64), b"\x0a\xa1" * 100])
            url = f"/v1/runs/{RUN}/rounds/{quote(n)}/partitions/{quote(p)}/evidence"
            return self.http.post(url, content=body, headers={"X-Cnode-Request": envelope})
        return self.http.post(f"/v1/runs/{RUN}/{op}", json={"envelope": envelope})

    def route_case(self) -> httpx.Response:
        rng = self.rng
        n = quote(rng.choice(PATH_NUMBERS), safe="")
        run = rng.choice([RUN] * 6 + [quote(t, safe="") or "x" for t in TEXTS[:8]])
        path = rng.choice(
            [
                "/v1/health",
                f"/v1/runs/{run}/state",
                f"/v1/runs/{run}/rounds/{n}",
                f"/v1/runs/{run}/rounds/{n}/scores",
                f"/v1/runs/{run}/checkpoints",
                f"/v1/runs/{run}/{rng.choice(list(Op))}",
                f"/v1/runs/{run}/rounds/{n}/partitions/{n}/evidence",
                f"/v1/runs/{run}/dashboard",
                "/",
                f"/dashboard/{quote(rng.choice([*TEXTS, 'app.js']), safe='')}",
                f"/{quote(rng.choice(TEXTS), safe='')}",
            ]
        )
        params = {
            k: rng.choice(QUERY_VALUES)
            for k in rng.sample(["wait", "until", "after", "limit", "x"], rng.randrange(4))
        }
        if params.get("wait") in ("11", "1e309") or params.get("wait", "0").isdigit():
            params["wait"] = rng.choice(["0", "0.01", "11", "-1", "nan"])  # no 10 s long polls
        method = rng.choice(["GET"] * 4 + ["POST"] * 3 + ["PUT", "DELETE"])
        if method != "POST":
            return self.http.request(method, path, params=params)
        body = rng.choice(
            [
                b"",
                os.urandom(rng.randrange(1, 2000)),
                b"[" * 50_000,
                b'{"envelope": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
                b'{"envelope": 123}',
                b'{"envelope": "not base64!"}',
                b'{"envelope": "' + base64.b64encode(os.urandom(300)) + b'"}',
                b'{"envelope": 1e999999}',
                b'{"envelope": "' + b"A" * 70_000 + b'"}',
                b"\xff\xfe{}",
                b"[1, 2]",
                b'"' + b"\\u0000" * 1000 + b'"',
            ]
        )
        return self.http.post(path, params=params, content=body)

    def check(self, response: httpx.Response) -> None:
        status = response.status_code
        self.statuses[status] += 1
        where = f"{response.request.method} {str(response.request.url)[:160]}"
        assert status < 500, f"seed {SEED}: {where} -> {status} {response.text[:300]}"
        if status >= 400 and response.headers["content-type"].startswith("text/plain"):
            # aiohttp's parser refused the request before any handler (a header field over
            # MAX_HEADER_FIELD_BYTES): 400 with its own one-line text (specs: Limits).
            assert status == 400 and "bytes when reading" in response.text, response.text[:200]
            self.codes["(aiohttp parser 400)"] += 1
            return
        if status >= 400:
            j = response.json()
            assert j["error"] in {str(c) for c in ErrorCode}, f"{where}: unregistered code {j}"
            assert ERRORS[ErrorCode(j["error"])].status == status, f"{where}: {status} {j}"
            assert isinstance(j["message"], str) and j["message"].strip(), f"{where}: {j}"
            self.codes[j["error"]] += 1


def _publish(running: Running, members: list[Identity]) -> dict[str, bytes]:
    """Round 1 published with every member; partition 0 has a recorded result."""

    async def main() -> None:
        clients = [
            CoordinatorClient(running.url, run=RUN, coordinator=running.peer_id, identity=m)
            for m in members
        ]
        for c in clients:
            await c.join()
            await c.join_round()
        for c, m in zip(clients, members, strict=True):
            await c.ready(1, header=str(compute_cid(m.peer_id_str.encode(), 0x71)))
        with trio.fail_after(20):
            info = await clients[0].wait_members(1)
        by_id = {m.peer_id_str: c for m, c in zip(members, clients, strict=True)}
        await by_id[info.aggregators[0]].result(1, partition=0, header=CID)
        for c in clients:
            await c.aclose()

    trio.run(main)
    tokens = {}
    for m in members:
        with running.client(m) as c:
            tokens[m.peer_id_str] = c.join().token
    return tokens


def test_fuzz_every_route_and_signed_request(serve: Any) -> None:
    members = [Identity.generate() for _ in range(MEMBERS)]
    running: Running = serve(
        run_config(members, partitioned="auto", min_participants=MEMBERS),
        evidence_checker=check_evidence,
        reputation_checker=check_reputation,
        hf_endpoint="http://127.0.0.1:9",  # never the real Hub
    )
    fuzz = Fuzzer(running, members, _publish(running, members))
    # Signed requests reach the most code: three of every four cases.
    cases: list[Callable[[], httpx.Response | None]] = [fuzz.signed_case] * 3 + [fuzz.route_case]
    started = time.monotonic()
    sent = 0
    while sent < CASES:
        response = fuzz.rng.choice(cases)()
        if response is None:
            continue
        fuzz.check(response)
        sent += 1
        if sent % 200 == 0:
            assert fuzz.http.get("/v1/health").json()["ok"] is True
    elapsed = time.monotonic() - started
    print(
        f"fuzz seed {SEED}: {sent} cases in {elapsed:.1f} s ({fuzz.unsendable} unsendable "
        f"skipped); statuses {dict(sorted(fuzz.statuses.items()))}; codes {dict(fuzz.codes)}"
    )
    assert fuzz.http.get("/v1/health").json()["ok"] is True
    assert len(fuzz.codes) >= 12, fuzz.codes  # the fuzz reached deep into the handlers
    fuzz.http.close()


def _raw_get(url: str, path: str) -> bytes:
    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_a_64_kib_url_is_refused_without_a_traceback(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    running: Running = serve(run_config([Identity.generate()]))
    caplog.set_level("INFO", logger="cnode.coordinator.http")
    for path in (f"/v1/runs/{RUN}/rounds/" + "9" * 65536, "/v1/health?x=" + "a" * 70_000):
        assert _raw_get(running.url, path).startswith(b"HTTP/1.0 400 ")
    records = [r for r in caplog.records if r.name == "cnode.coordinator.http"]
    assert records and all(r.exc_info is None and r.levelname == "INFO" for r in records)
    assert "refused a malformed HTTP request: 400" in records[0].getMessage()
    assert httpx.get(f"{running.url}/v1/health").json()["ok"] is True
