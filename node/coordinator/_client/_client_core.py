"""What both coordinator clients share (``_client.py`` async, ``_sync_client.py`` sync):
request signing, counters, answer decoding and the run-state signature check. No I/O.
See specs/coordinator.md#client.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from cnode.auth import EnvelopeError, Identity, open_envelope, seal

from .. import limits
from .._codes import ErrorCode
from .._exceptions import (
    BadRunState,
    CoordinatorRejected,
    CoordinatorUnavailable,
    RateLimited,
    RunConfigError,
)
from .._wire._json import JSONTooDeep, loads_bounded
from .._wire._protocol import (
    REQUEST_TYPE,
    STATE_TYPE,
    CheckpointHistory,
    CheckpointRecord,
    JoinResult,
    Op,
    RunState,
    b64decode,
    b64encode,
)

__all__ = ["HTTP_TIMEOUT", "Core", "check_url", "map_transport", "verify_state_envelope"]

# Re-join when the access token has less than this many seconds left.
_TOKEN_REFRESH_S = 60.0
# HTTP timeouts: a long poll holds the connection up to MAX_LONG_POLL_S.
HTTP_TIMEOUT = httpx.Timeout(10.0, read=limits.MAX_LONG_POLL_S + 10.0)


def verify_state_envelope(data: bytes, *, run: str, coordinator: str) -> dict[str, Any]:
    """Open a ``cnode/run-state/v1`` envelope signed by ``coordinator`` for ``run``.

    Used for states read over HTTP and for states relayed by peers on gossipsub: the signature,
    not the sender, makes them authentic. Raises :class:`BadRunState`.
    """
    try:
        opened = open_envelope(data, expected_type=STATE_TYPE, expected_signer=coordinator)
    except EnvelopeError as exc:
        raise BadRunState(
            f"run state not signed by the pinned coordinator {coordinator}: {exc}"
        ) from exc
    if opened.payload.get("run") != run:
        raise BadRunState(f"signed state is for run {opened.payload.get('run')!r}, not {run!r}")
    return dict(opened.payload)


class Core:
    """What both clients share: request signing, counters, answer decoding. No I/O."""

    def __init__(self, url: str, run: str, coordinator: str, identity: Identity) -> None:
        check_url(url, "coordinator url")
        self.url = url.rstrip("/")
        self.run = run
        self.coordinator = coordinator
        self.identity = identity
        self.joined: JoinResult | None = None
        self._join_args: dict[str, Any] = {}
        self._counter = 0
        self._last_version = 0

    def path(self, tail: str) -> str:
        return f"{self.url}/v1/runs/{self.run}/{tail}"

    def next_counter(self) -> int:
        # Microseconds since the epoch, forced strictly increasing: a restarted client needs no
        # saved counter to stay above the one the coordinator last saw from it.
        self._counter = max(self._counter + 1, time.time_ns() // 1000)
        return self._counter

    def request_body(self, op: Op, args: Mapping[str, Any], *, with_token: bool) -> dict[str, str]:
        payload: dict[str, Any] = {
            "run": self.run,
            "op": str(op),
            "counter": self.next_counter(),
            "args": dict(args),
        }
        if with_token:
            if self.joined is None:
                raise CoordinatorRejected(
                    401, ErrorCode.BAD_TOKEN, "join the run before this request"
                )
            payload["token"] = self.joined.token
        return {"envelope": b64encode(seal(self.identity, REQUEST_TYPE, payload))}

    def retry_replayed(self, exc: CoordinatorRejected, attempt: int) -> bool:
        """Whether to resend once with a fresh counter: another client with this key (the CLI
        beside a running node) used a higher counter. A refused request changed nothing."""
        if exc.code is not ErrorCode.REPLAYED or attempt > 0:
            return False
        self._counter = max(self._counter, time.time_ns() // 1000) + 1_000_000
        return True

    def needs_rejoin(self) -> bool:
        if self.joined is None:
            return False
        return self.joined.expires_at_ms / 1000 - time.time() < _TOKEN_REFRESH_S

    @staticmethod
    def answer(response: httpx.Response) -> dict[str, Any]:
        try:
            body = loads_bounded(response.content)
        except JSONTooDeep as exc:  # no coordinator answers this: not worth a retry
            raise BadRunState(f"coordinator answered {response.status_code} with {exc}") from exc
        except ValueError as exc:
            raise CoordinatorUnavailable(
                f"coordinator answered {response.status_code} without JSON"
            ) from exc
        if not isinstance(body, dict):
            raise CoordinatorUnavailable("coordinator answered JSON that is not an object")
        if response.status_code >= 500:  # its fault, and maybe passing: callers may retry
            raise CoordinatorUnavailable(
                f"coordinator answered {response.status_code}: {body.get('message', '')}"
            )
        if response.status_code >= 400:
            code = str(body.get("error", "error"))
            message = str(body.get("message", ""))
            if response.status_code == 429:
                raise RateLimited(429, code, message, _retry_after(response))
            raise CoordinatorRejected(response.status_code, code, message)
        return body

    def signed(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            data = b64decode(body.get("envelope"))
        except ValueError as exc:
            raise BadRunState(f"coordinator sent no signed state: {exc}") from exc
        return verify_state_envelope(data, run=self.run, coordinator=self.coordinator)

    def checkpoints(self, body: dict[str, Any], after: int) -> list[CheckpointRecord]:
        history = CheckpointHistory.from_payload(self.signed(body))
        if history.after != after:
            raise BadRunState("signed checkpoint history is for another page")
        return history.checkpoints

    def run_state(self, body: dict[str, Any]) -> RunState:
        state = RunState.from_payload(self.signed(body))
        if state.coordinator != self.coordinator:
            raise BadRunState("signed state names another coordinator")
        if state.version < self._last_version:
            raise BadRunState(
                f"state version {state.version} is older than one already seen "
                f"({self._last_version})"
            )
        self._last_version = state.version
        return state


def _retry_after(response: httpx.Response) -> float:
    """Seconds of a 429's Retry-After, within [0, CLIENT_RETRY_MAX_S] (1 when absent or not a
    finite number: the header is the remote's to fill)."""
    try:
        wait = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        return 1.0
    return min(max(wait, 0.0), limits.CLIENT_RETRY_MAX_S) if math.isfinite(wait) else 1.0


def check_url(url: str, what: str) -> None:
    """Raise :class:`RunConfigError` unless ``url`` is an http(s) URL with a host: any other
    scheme (``javascript:``, ``file:``) is refused at once, never retried as an outage."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RunConfigError(f"{what} {url[:100]!r} is not an http(s) URL")


def map_transport(exc: httpx.HTTPError, url: str) -> CoordinatorUnavailable:
    return CoordinatorUnavailable(f"cannot reach the coordinator at {url}: {exc!r}")
