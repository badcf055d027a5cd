"""The async client of the coordinator API, :class:`CoordinatorClient` (the sync one for the CLI
is ``_sync_client.py``).

Both sign every request with the node's identity, number them with a strictly increasing counter
(replay protection), and verify every state they read against the pinned coordinator peer id:
a state with a bad or missing signature raises :class:`BadRunState` and is never returned.

The async client is built on ``httpx.AsyncClient`` and ``anyio``, so it runs under trio (the
training loop) and asyncio alike. Its methods take no timeouts: wrap calls in
``trio.fail_after`` / ``anyio.fail_after``. See specs/coordinator.md#client.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import httpx
import structlog

from cnode.auth import Identity

from .. import limits
from .._config import RunConfig
from .._exceptions import BadRunState, CoordinatorRejected, CoordinatorUnavailable, RateLimited
from .._wire._ban_records import BanRecord, BanReport
from .._wire._protocol import (
    EVIDENCE_HEADER,
    CheckpointRecord,
    JoinResult,
    Op,
    RoundInfo,
    RoundStatus,
    RunState,
    Until,
    b64decode,
    b64encode,
)
from ._client_core import HTTP_TIMEOUT, Core, map_transport, verify_state_envelope

__all__ = ["CoordinatorClient", "verify_state_envelope"]  # the latter from _client_core

log = structlog.get_logger(__name__)
T = TypeVar("T")

# Evidence: the upload and the coordinator's recomputation of one partition.
_EVIDENCE_TIMEOUT = httpx.Timeout(10.0, read=limits.EVIDENCE_READ_TIMEOUT_S, write=60.0)


class CoordinatorClient:
    """Async client of one run's coordinator (trio or asyncio).

    ``async with CoordinatorClient(url, run=..., coordinator=PEER_ID, identity=...) as c:``.
    Signed requests are serialized by a lock, so one client may be shared by tasks.

    Resource handling: the HTTP client is closed on exit (unless it was passed in).
    Error handling: :class:`CoordinatorUnavailable` (network), :class:`CoordinatorRejected` /
    :class:`RateLimited` (4xx: ``.code`` names why), :class:`BadRunState` (bad signature).
    """

    def __init__(
        self,
        url: str,
        *,
        run: str,
        coordinator: str,
        identity: Identity,
        http: httpx.AsyncClient | None = None,
        outage_s: float | None = None,
    ) -> None:
        self._core = Core(url, run, coordinator, identity)
        self._outage_s = limits.COORDINATOR_OUTAGE_S if outage_s is None else outage_s
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=HTTP_TIMEOUT)
        self._lock = anyio.Lock()

    @classmethod
    def for_run(
        cls, config: RunConfig, identity: Identity, *, url: str | None = None
    ) -> CoordinatorClient:
        """A client for the run config's coordinator (``url`` overrides ``config.url``)."""
        return cls(
            url or config.url, run=config.run, coordinator=config.coordinator, identity=identity
        )

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    @property
    def joined(self) -> JoinResult | None:
        """The last join's answer (token, username, expiry), or None before joining."""
        return self._core.joined

    @property
    def token(self) -> bytes | None:
        """The access token to show peers (verify with ``cnode.auth.verify_access_token``)."""
        return None if self._core.joined is None else self._core.joined.token

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, retried with backoff while the coordinator is unavailable (a restart),
        for up to ``outage_s``; rate-limit answers wait their Retry-After. Every retried
        request is one the coordinator applies idempotently (specs/coordinator.md#client)."""
        give_up: float | None = None
        delay = limits.CLIENT_RETRY_FIRST_S
        while True:
            try:
                result = await call()
            except RateLimited as exc:
                await anyio.sleep(min(max(exc.retry_after_s, 0.05), limits.CLIENT_RETRY_MAX_S))
                continue
            except CoordinatorUnavailable as exc:
                now = time.monotonic()
                if give_up is None:
                    give_up = now + self._outage_s
                    log.warning("coordinator_unavailable", request=what, error=str(exc))
                if now >= give_up:
                    raise CoordinatorUnavailable(
                        f"{exc} (gave up after {self._outage_s:g} s of retries)"
                    ) from exc
                await anyio.sleep(min(delay, give_up - now))
                delay = min(2 * delay, limits.CLIENT_RETRY_MAX_S)
                continue
            if give_up is not None:
                log.info("coordinator_available_again", request=what)
            return result

    async def _get(self, tail: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        async def once() -> dict[str, Any]:
            try:
                response = await self._http.get(self._core.path(tail), params=params)
            except httpx.HTTPError as exc:
                raise map_transport(exc, self._core.url) from exc
            return self._core.answer(response)

        return await self._retrying(f"GET {tail}", once)

    async def _post(self, op: Op, args: Mapping[str, Any], *, token: bool) -> dict[str, Any]:
        if token and op is not Op.JOIN and self._core.needs_rejoin():
            await self.join(**self._core._join_args)
        return await self._retrying(str(op), lambda: self._post_once(op, args, token=token))

    async def _post_once(self, op: Op, args: Mapping[str, Any], *, token: bool) -> dict[str, Any]:
        async def send() -> httpx.Response:
            async with self._lock:
                body = self._core.request_body(op, args, with_token=token)
                try:
                    return await self._http.post(self._core.path(str(op)), json=body)
                except httpx.HTTPError as exc:
                    raise map_transport(exc, self._core.url) from exc

        return await self._resend_if_replayed(send)

    async def _resend_if_replayed(
        self, send: Callable[[], Awaitable[httpx.Response]]
    ) -> dict[str, Any]:
        """The answer to ``send()`` (which signs a fresh request each call), sent once more when
        the coordinator refused it as ``replayed`` (``_ClientCore.retry_replayed``)."""
        for attempt in range(2):
            response = await send()
            try:
                return self._core.answer(response)
            except CoordinatorRejected as exc:
                if not self._core.retry_replayed(exc, attempt):
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    # -- membership ---------------------------------------------------------------------------

    async def join(
        self,
        *,
        hf_binding: bytes | None = None,
        hf_token: str | None = None,
        addrs: Sequence[str] = (),
    ) -> JoinResult:
        """Get an access token: by peer id alone, or with an HF binding + HF token (both).

        ``addrs``: the multiaddrs other peers can dial this node at; the coordinator hands them
        to the members of this node's rounds (specs/coordinator.md#peer-addresses).
        """
        args: dict[str, Any] = {}
        if hf_binding is not None or hf_token is not None:
            args = {"hf_binding": hf_binding, "hf_token": hf_token}
        if addrs:
            args["addrs"] = list(addrs)
        result = JoinResult.from_json(await self._post(Op.JOIN, args, token=False))
        self._core.joined = result
        self._core._join_args = {"hf_binding": hf_binding, "hf_token": hf_token, "addrs": addrs}
        return result

    def resume(self, joined: JoinResult) -> None:
        """Use a token from an earlier join (e.g. saved across a node restart) without re-joining.

        Automatic re-join near expiry needs :meth:`join`'s arguments, so it only happens after a
        ``join()`` in this client.
        """
        self._core.joined = joined

    async def join_round(self) -> int:
        """Say this peer takes part; returns the round it landed in (current or next)."""
        body = await self._post(Op.JOIN_ROUND, {}, token=True)
        return int(body["round"])

    async def ready(self, round: int, *, header: str | None = None) -> None:
        """Local training for ``round`` is done; the first ready closes the member list.

        ``header``: the CID of this peer's signed update header; the published round lists it
        (``RoundInfo.headers``) so members can fetch it as a block.
        """
        args: dict[str, Any] = {"round": round}
        if header is not None:
            args["header"] = str(header)
        await self._post(Op.READY, args, token=True)

    async def leave(self, round: int) -> None:
        """Leave ``round``; before the list closes this never fails the round."""
        await self._post(Op.LEAVE, {"round": round}, token=True)

    async def collected(self, round: int, *, missing: Sequence[str]) -> None:
        """Report which members' updates of published ``round`` this node could not fetch
        (verified, whole); the coordinator decides the round's input set from the reports."""
        await self._post(Op.COLLECTED, {"round": round, "missing": sorted(missing)}, token=True)

    # -- partitioned rounds (specs/coordinator.md#partitioned-rounds) ----------------------------

    async def result(self, round: int, *, partition: int, header: str) -> None:
        """Record this node's signed partition result header (its CID) for ``partition``.

        Refused (``CoordinatorRejected``) with ``not_your_partition`` when this node is neither
        the partition's aggregator nor a backup whose time has come, and ``result_recorded``
        when another header stands for it (the message names it)."""
        args = {"round": round, "partition": partition, "header": str(header)}
        await self._post(Op.RESULT, args, token=True)

    async def score(self, round: int, *, record: bytes) -> str:
        """Send this node's signed score record; return its CID. Refused (409)
        ``score_recorded`` (another one stands) or ``scores_closed`` (too late)."""
        args = {"round": round, "record": b64encode(record)}
        answer = await self._post(Op.SCORE, args, token=True)
        return str(answer.get("record"))

    async def score_records(self, round: int) -> dict[str, bytes]:
        """``round``'s score records (member -> envelope bytes): check them against the signed
        round record's CIDs."""
        body = await self._get(f"rounds/{round}/scores")
        raw = body.get("records")
        if not isinstance(raw, dict) or len(raw) > limits.MAX_ROUND_MEMBERS:
            raise BadRunState("score records must be a map of at most MAX_ROUND_MEMBERS")
        try:
            return {str(p): b64decode(v) for p, v in raw.items()}
        except ValueError as exc:
            raise BadRunState(f"a score record is not base64: {exc}") from exc

    async def checked(self, round: int, *, wrong: Sequence[int]) -> None:
        """Report the partitions this node recomputed and found wrong (usually none), after
        every partition of ``round`` has a result; send evidence for each wrong one first."""
        await self._post(Op.CHECKED, {"round": round, "wrong": sorted(set(wrong))}, token=True)

    async def partition_evidence(
        self, round: int, *, partition: int, header: str, output: str, car: bytes
    ) -> dict[str, Any]:
        """Send the evidence (a CAR v1 of the blocks) that the recorded result ``header`` of
        ``partition``, which names ``output``, is wrong. The coordinator recomputes it: the
        answer is ``{"banned": True, "recomputed": CID, "replaced": bool}``; a correct result is
        refused 409 ``result_correct``, malformed evidence 400 ``bad_evidence``."""
        if len(car) > limits.MAX_EVIDENCE_BYTES:
            raise CoordinatorRejected(413, "too_large", "evidence over MAX_EVIDENCE_BYTES")
        if self._core.needs_rejoin():
            await self.join(**self._core._join_args)
        args = {"round": round, "partition": partition, "header": str(header)}
        args["output"] = str(output)
        tail = f"rounds/{round}/partitions/{partition}/evidence"

        async def send() -> httpx.Response:
            # Signed under the lock, sent outside it: the upload and the recomputation may take
            # minutes, and this client's other requests must not wait for them (the coordinator
            # takes the counter before it reads the body; losing that race to a later request
            # is the `replayed` case, resent once).
            async with self._lock:
                body = self._core.request_body(Op.WRONG_RESULT, args, with_token=True)
            try:
                return await self._http.post(
                    self._core.path(tail),
                    content=car,
                    headers={
                        EVIDENCE_HEADER: body["envelope"],
                        "Content-Type": "application/vnd.ipld.car",
                    },
                    timeout=_EVIDENCE_TIMEOUT,
                )
            except httpx.HTTPError as exc:
                raise map_transport(exc, self._core.url) from exc

        return await self._retrying(str(Op.WRONG_RESULT), lambda: self._resend_if_replayed(send))

    async def wait_results(self, round: int) -> RoundInfo:
        """Wait until every partition of ``round`` has a recorded result, or the round is
        agreed, and return the record (at once for a published full-replication round). Bound
        it yourself."""
        while True:
            info = await self.round_info(round, wait_s=limits.MAX_LONG_POLL_S, until=Until.RESULTS)
            done = info.listed and len(info.results) >= info.parts
            if done or info.status is RoundStatus.AGREED:
                return info
            await anyio.sleep(0)

    # -- reads (verified) -----------------------------------------------------------------------

    async def run_state(self) -> RunState:
        return self._core.run_state(await self._get("state"))

    async def round_info(
        self, round: int, *, wait_s: float = 0.0, until: Until = Until.PUBLISHED
    ) -> RoundInfo:
        """The round's signed record; with ``wait_s`` the server holds until it is published
        (``Until.PUBLISHED``), its input set is agreed (``Until.AGREED``), every partition has
        a result (``Until.RESULTS``), its score records closed (``Until.SCORES``) or a
        checkpoint of it is recorded (``Until.CHECKPOINT``)."""
        wait = f"{min(max(wait_s, 0.0), limits.MAX_LONG_POLL_S):g}"
        body = await self._get(f"rounds/{round}", {"wait": wait, "until": str(Until(until))})
        info = RoundInfo.from_payload(self._core.signed(body))
        if info.round != round:
            raise BadRunState(f"asked for round {round}, got a signed record of {info.round}")
        return info

    async def wait_members(self, round: int) -> RoundInfo:
        """Wait until ``round``'s member list is published and return it. Bound it yourself."""
        while True:
            info = await self.round_info(round, wait_s=limits.MAX_LONG_POLL_S)
            if info.listed:
                return info
            await anyio.sleep(0)  # a checkpoint for cancellation between long polls

    async def wait_agreed(self, round: int) -> RoundInfo:
        """Wait until ``round``'s input set is decided and return the record. Bound it yourself."""
        while True:
            info = await self.round_info(round, wait_s=limits.MAX_LONG_POLL_S, until=Until.AGREED)
            if info.status is RoundStatus.AGREED:
                return info
            await anyio.sleep(0)

    async def wait_scores_closed(self, round: int) -> RoundInfo:
        """Wait until ``round``'s score records are closed (or it is agreed) and return the
        record. Bound it yourself."""
        while True:
            info = await self.round_info(round, wait_s=limits.MAX_LONG_POLL_S, until=Until.SCORES)
            if info.scores_closed or info.status is RoundStatus.AGREED:
                return info
            await anyio.sleep(0)

    async def wait_checkpoint(self, round: int) -> CheckpointRecord | None:
        """Wait until a checkpoint of ``round`` or a later round is recorded and return the
        current one (from the signed run state: one more read once the long poll answers).
        Bound it yourself."""
        while True:
            await self.round_info(round, wait_s=limits.MAX_LONG_POLL_S, until=Until.CHECKPOINT)
            record = await self.current_checkpoint()
            if record is not None and record.round >= round:
                return record
            await anyio.sleep(0)

    async def checkpoints(
        self, *, after: int = -1, limit: int = limits.MAX_CHECKPOINT_PAGE
    ) -> list[CheckpointRecord]:
        """The signed history: checkpoints of rounds > ``after``, oldest first (one page)."""
        body = await self._get("checkpoints", {"after": str(after), "limit": str(limit)})
        return self._core.checkpoints(body, after)

    async def current_checkpoint(self) -> CheckpointRecord | None:
        return (await self.run_state()).checkpoint

    async def bans(self) -> list[BanRecord]:
        return (await self.run_state()).bans

    # -- checkpoints and bans -------------------------------------------------------------------

    async def submit_checkpoint(
        self,
        *,
        epoch: int,
        round: int,
        manifest: str,
        hf_repo: str | None = None,
        hf_revision: str | None = None,
    ) -> CheckpointRecord:
        args = {
            "epoch": epoch,
            "round": round,
            "manifest": str(manifest),
            "hf_repo": hf_repo,
            "hf_revision": hf_revision,
        }
        body = await self._post(Op.CHECKPOINT, args, token=True)
        return CheckpointRecord.from_payload(body["checkpoint"])

    async def report_ban_evidence(self, evidence: Mapping[str, Any]) -> BanReport:
        """Send ``BanRecommendation.to_payload()`` ({peer, round, reason, update_cid, figures})."""
        return BanReport.from_json(await self._post(Op.BAN_EVIDENCE, evidence, token=True))

    async def report(self, report: Mapping[str, Any]) -> None:
        """Send this node's measurements (held-out loss, catch-up) for the dashboard."""
        await self._post(Op.REPORT, report, token=True)

    async def admin(self, action: str, **args: Any) -> dict[str, Any]:
        """An admin action (the identity must be the coordinator's key or an admin key)."""
        return await self._post(Op.ADMIN, {"action": action, **args}, token=False)
