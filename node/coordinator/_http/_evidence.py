"""The evidence handlers: a wrong partition result, and the records behind a reputation report.

``POST /v1/runs/<run>/rounds/<r>/partitions/<p>/evidence``: the signed request (op
`wrong_result`, args ``{round, partition, header, output}``) travels base64 in the
``X-Cnode-Request`` header, the body is a CAR v1 file of evidence blocks (at most
``MAX_EVIDENCE_BYTES``, read streaming here, outside the app's ``client_max_size``). The
recomputation (``ServeSettings.evidence_checker``) runs in a worker thread; the rules
(``_bans/_evidence.py``) judge its verdict, and a wrong result bans its signer at once. See
specs/coordinator.md#evidence-of-a-wrong-result.

A reputation report (op ``ban_evidence``) is first checked against the score records the
coordinator holds: gathered here in one transaction (what to gather: ``_bans/_reputation.py``),
replayed by ``ServeSettings.reputation_checker`` in a worker thread (at most
MAX_EVIDENCE_CHECKS at once, with partition evidence). See specs/coordinator.md#bans.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from cnode import CnodeError

from .. import limits
from .._bans._evidence import EvidenceChecker, judge_partition_verdict
from .._bans._reputation import (
    RecordedRound,
    ReputationChecker,
    checked_kind,
    record_input,
    replay_bound,
    replay_round,
)
from .._bans._verdicts import ReputationVerdict
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import BadEvidence, RequestRefused
from .._store._store import Store
from .._wire._protocol import EVIDENCE_HEADER, Op
from ._admission import Admission
from ._driver import RunDriver
from ._http import RateLimitedRefusal, SignedRequest, open_signed_request
from ._ratelimit import RateLimiter
from ._requests import int_text, parse_wrong_result
from ._slots import EvidenceSlots, read_evidence_body

__all__ = ["EvidenceDesk"]

log = structlog.get_logger(__name__)


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


class EvidenceDesk:
    """The checks of one run's evidence, with the server's store, driver, admission and slots
    (``after_change``: the server's, run after a committed change)."""

    def __init__(
        self,
        config: RunConfig,
        store: Store,
        driver: RunDriver,
        admission: Admission,
        slots: EvidenceSlots,
        request_limit: RateLimiter,
        after_change: Callable[[], Awaitable[None]],
        evidence_checker: EvidenceChecker | None,
        reputation_checker: ReputationChecker | None,
    ) -> None:
        self.config = config
        self.run = config.run
        self.store = store
        self.driver = driver
        self.admission = admission
        self.slots = slots
        self.request_limit = request_limit
        self.after_change = after_change
        self.evidence_checker = evidence_checker
        self.reputation_checker = reputation_checker

    # -- a wrong partition result ---------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        """Check who sends it and what it names, read the CAR, recompute, ban when wrong
        (the caller checked the run in the path)."""
        n_path, p_path = _path_ints(request)
        req = _signed(request, self.run)
        n, partition, header, output = parse_wrong_result(req.args)
        if (n, partition) != (n_path, p_path):
            raise RequestRefused(
                E.BAD_REQUEST,
                f"the signed request names round {n} partition {partition}, the path "
                f"round {n_path} partition {p_path}",
            )
        peer = req.signer
        wait = self.request_limit.take(peer, time.time())
        if wait > 0:
            raise RateLimitedRefusal(wait)
        # Everything cheap first: who, which round, which recorded result. The counter is
        # consumed here, before the body is read, so a long check never races the reporter's
        # next requests (a replay of evidence could only get the same answer again anyway).
        username = self.admission.access(peer, req.token, time.time())
        with self.store.tx():
            self.driver.check_not_banned(peer, username)
            self.driver.evidence_target(peer, n, partition, header)
            self.driver.consume_counter(peer, req.counter)
        async with self.slots.hold(peer):
            result = await self._check(request, peer, n, partition, header, output)
        await self.after_change()
        return web.json_response({"ok": True, **result})

    async def _check(
        self, request: web.Request, peer: str, n: int, partition: int, header: str, output: str
    ) -> dict[str, Any]:
        with self.store.tx():
            recorded = self.driver.evidence_target(peer, n, partition, header)
        if recorded.replaced is not None:  # shown wrong already (a resend, or a second reporter)
            return {"banned": True, "recomputed": recorded.replaced, "replaced": True}
        checker = self.evidence_checker
        if checker is None:
            raise RequestRefused(
                E.NO_EVIDENCE_CHECKER, "this coordinator was started without an evidence checker"
            )
        car = await read_evidence_body(request, self.slots.timing)
        try:
            verdict = await asyncio.to_thread(
                checker,
                car,
                header,
                run=self.run,
                round_=n,
                partition=partition,
                training=self.config.training,
            )
        except BadEvidence as exc:
            raise RequestRefused(E.BAD_EVIDENCE, f"evidence: {exc}") from exc
        except CnodeError as exc:  # the checker's own failure (a bug, a bad run config): ours
            log.exception("evidence_check_failed", round=n, partition=partition)
            raise RequestRefused(
                E.EVIDENCE_CHECK_FAILED, f"the coordinator could not check the evidence: {exc}"
            ) from exc
        del car
        judge_partition_verdict(verdict, recorded, n, partition)
        now = time.time()
        with self.store.tx():
            self.driver.evidence_target(peer, n, partition, header)
            self.driver.wrong_result(
                peer,
                n,
                partition,
                signer=verdict.signer,
                claimed=verdict.claimed,
                recomputed=verdict.recomputed,
                reported=output,
                now=now,
            )
            entry = self.store.results(n)[partition]
        log.info("wrong_partition_result", round=n, partition=partition, signer=verdict.signer)
        # replaced: false when the round was agreed before the evidence came (the ban stands)
        return {
            "banned": True,
            "recomputed": verdict.recomputed,
            "replaced": entry.replaced == verdict.recomputed,
        }

    # -- the records behind a reputation report ---------------------------------------------------

    async def reputation_verdict(
        self, peer: str, token: Any, evidence: dict[str, Any]
    ) -> ReputationVerdict | None:
        """The replay's verdict on a reputation report, or None (not one, no checker, the
        accused banned already, or the records cannot decide). Who reports whom is checked
        first, so a stranger never costs a replay; the ban book re-checks everything in its
        transaction."""
        checker = self.reputation_checker
        record = checked_kind(evidence)
        if checker is None or record is None:
            return None
        n, accused = int(evidence["round"]), str(evidence["peer"])
        username = self.admission.access(peer, token, time.time())
        with self.store.tx():
            self.driver.check_not_banned(peer, username)
            self.driver.parties(peer, evidence)
            if self.store.ban_row(accused) is not None:
                return None
        # The slot first, the records then: what waits for a slot holds no records (at most
        # MAX_EVIDENCE_CHECKS replays' records in memory at once).
        async with self.slots.hold(peer):
            with self.store.tx():
                rounds = self._record(n, accused) if record else self._replay(n)
            if isinstance(rounds, str):
                log.info("reputation_unchecked", peer=accused, round=n, why=rounds)
                return None
            verdict = await asyncio.to_thread(
                checker,
                rounds,
                run=self.run,
                accused=accused,
                round_=n,
                figures=evidence["figures"],
            )
        if not verdict.decided:
            log.info("reputation_unchecked", peer=accused, round=n, why=verdict.reason)
        return verdict

    def _record(self, n: int, accused: str) -> list[RecordedRound] | str:
        data = self.store.score_bytes(n).get(accused)
        return record_input(self.store.round_facts(n), n, accused, data)

    def _replay(self, n: int) -> list[RecordedRound] | str:
        """Rounds 1..n read one at a time, stopping at the first the records cannot decide."""
        too_many = replay_bound(n)
        if too_many is not None:
            return too_many
        out: list[RecordedRound] = []
        opened = 0
        for r in range(1, n + 1):
            f = self.store.round_facts(r)
            got = replay_round(f, r, self.store.score_bytes(r), opened)
            if isinstance(got, str):
                return got
            replayed, opened = got
            out.append(replayed)
        return out
