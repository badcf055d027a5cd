"""Evidence against a wrong partition result: the coordinator recomputes it and bans at once.

``POST /v1/runs/<run>/rounds/<r>/partitions/<p>/evidence``: the signed request (op
`wrong_result`, args ``{round, partition, header, output}``) travels base64 in the
``X-Cnode-Request`` header, the body is a CAR v1 file of evidence blocks (at most
``MAX_EVIDENCE_BYTES``, read streaming here, outside the app's ``client_max_size``). The
recomputation is the server's ``ServeSettings.evidence_checker`` (``cnode coordinator serve``
gives ``cnode.node.train.check_partition_evidence``, which pulls torch; the coordinator package
never imports the training package) run in a worker thread. See
specs/coordinator.md#evidence-of-a-wrong-result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Protocol

import structlog
from aiohttp import web

from cnode import CnodeError

from .. import limits
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import BadEvidence, RequestRefused
from .._http._http import RateLimitedRefusal, SignedRequest, open_signed_request
from .._http._ratelimit import RateLimiter
from .._http._requests import int_text, parse_wrong_result
from .._rounds._machine import RunMachine
from .._rounds._partitions import PartitionRules
from .._store._store import Store
from .._wire._protocol import EVIDENCE_HEADER, Op
from ._slots import EvidenceSlots, read_evidence_body
from ._verdicts import PartitionVerdict

__all__ = [
    "EvidenceChecker",
    "handle_evidence",
]

log = structlog.get_logger(__name__)


class EvidenceChecker(Protocol):
    """Recompute a partition result from a CAR of evidence blocks; raise :class:`BadEvidence`
    when the evidence is malformed (``cnode.node.train.check_partition_evidence``, translated)."""

    def __call__(
        self,
        car: bytes,
        header: str,
        *,
        run: str,
        round_: int,
        partition: int,
        training: Mapping[str, Any],
    ) -> PartitionVerdict: ...


class _Server(Protocol):
    """What the evidence handler uses of ``_server.CoordinatorServer`` (not imported: it
    imports this module, and an import cycle, even for types only, is refused by
    tests/test_layering.py)."""

    run: str
    config: RunConfig
    store: Store
    machine: RunMachine
    evidence_slots: EvidenceSlots
    evidence_checker: EvidenceChecker | None
    _request_limit: RateLimiter

    @property
    def partitions(self) -> PartitionRules: ...

    def _check_run(self, request: web.Request) -> None: ...

    def access(self, peer: str, token: Any, now: float) -> str: ...

    async def after_change(self) -> None: ...


def _path_ints(request: web.Request) -> tuple[int, int]:
    n = int_text(request.match_info["round"], "round", 1, limits.MAX_ROUND, "MAX_ROUND")
    p = int_text(
        request.match_info["partition"],
        "partition",
        0,
        limits.MAX_ROUND_MEMBERS,
        "MAX_ROUND_MEMBERS",
    )
    return n, p


def _signed(request: web.Request, run: str) -> SignedRequest:
    envelope = request.headers.get(EVIDENCE_HEADER)
    if envelope is None:
        raise RequestRefused(
            E.BAD_REQUEST, f"the signed wrong_result request goes in {EVIDENCE_HEADER}"
        )
    return open_signed_request(envelope.strip(), Op.WRONG_RESULT, run)


async def handle_evidence(server: _Server, request: web.Request) -> web.Response:
    """Check who sends it and what it names, read the CAR, recompute, ban when wrong."""
    server._check_run(request)
    n_path, p_path = _path_ints(request)
    req = _signed(request, server.run)
    n, partition, header, output = parse_wrong_result(req.args)
    if (n, partition) != (n_path, p_path):
        raise RequestRefused(
            E.BAD_REQUEST,
            f"the signed request names round {n} partition {partition}, the path "
            f"round {n_path} partition {p_path}",
        )
    peer = req.signer
    wait = server._request_limit.take(peer, time.time())
    if wait > 0:
        raise RateLimitedRefusal(wait)
    # Everything cheap first: who, which round, which recorded result. The counter is consumed
    # here, before the body is read, so a long check never races the reporter's next requests
    # (a replay of evidence could only get the same answer again anyway).
    username = server.access(peer, req.token, time.time())
    with server.store.tx():
        server.machine.check_not_banned(peer, username)
        server.partitions.evidence_target(peer, n, partition, header)
        server.machine.consume_counter(peer, req.counter)
    async with server.evidence_slots.hold(peer):
        result = await _check(server, request, peer, n, partition, header, output)
    await server.after_change()
    return web.json_response({"ok": True, **result})


async def _check(
    server: _Server,
    request: web.Request,
    peer: str,
    n: int,
    partition: int,
    header: str,
    output: str,
) -> dict[str, Any]:
    recorded = server.partitions.evidence_target(peer, n, partition, header)
    if recorded["replaced"] is not None:  # shown wrong already (a resend, or a second reporter)
        return {"banned": True, "recomputed": recorded["replaced"], "replaced": True}
    checker = server.evidence_checker
    if checker is None:
        raise RequestRefused(
            E.NO_EVIDENCE_CHECKER, "this coordinator was started without an evidence checker"
        )
    car = await read_evidence_body(request, server.evidence_slots.timing)
    try:
        verdict = await asyncio.to_thread(
            checker,
            car,
            header,
            run=server.run,
            round_=n,
            partition=partition,
            training=server.config.training,
        )
    except BadEvidence as exc:
        raise RequestRefused(E.BAD_EVIDENCE, f"evidence: {exc}") from exc
    except CnodeError as exc:  # the checker's own failure (a bug, a bad run config): ours
        log.exception("evidence_check_failed", round=n, partition=partition)
        raise RequestRefused(
            E.EVIDENCE_CHECK_FAILED, f"the coordinator could not check the evidence: {exc}"
        ) from exc
    del car
    if verdict.partition != partition:
        raise RequestRefused(
            E.BAD_EVIDENCE,
            f"the header is for partition {verdict.partition}, not {partition}",
        )
    if verdict.signer != recorded["peer"]:
        raise RequestRefused(
            E.BAD_EVIDENCE,
            f"the header is signed by {verdict.signer}; the result was recorded from "
            f"{recorded['peer']}",
        )
    if verdict.correct:
        raise RequestRefused(
            E.RESULT_CORRECT,
            f"the recomputation of partition {partition} of round {n} gives {verdict.recomputed},"
            f" as the header says: the result is correct (no ban, nothing recorded)",
        )
    now = time.time()
    with server.store.tx():
        server.partitions.evidence_target(peer, n, partition, header)
        server.partitions.wrong_result(
            peer,
            n,
            partition,
            signer=verdict.signer,
            claimed=verdict.claimed,
            recomputed=verdict.recomputed,
            reported=output,
            now=now,
        )
        entry = server.store.results(n)[partition]
    log.info("wrong_partition_result", round=n, partition=partition, signer=verdict.signer)
    # replaced: false when the round was agreed before the evidence came (the ban stands)
    return {
        "banned": True,
        "recomputed": verdict.recomputed,
        "replaced": entry["replaced"] == verdict.recomputed,
    }
