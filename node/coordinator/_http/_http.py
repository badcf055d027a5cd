"""HTTP plumbing of the coordinator: reading a signed request, and refusals as JSON.

aiohttp and auth exceptions are translated here and only here (specs/coordinator.md#errors).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cnode.auth import BadSignature, EnvelopeError, open_envelope

from .. import limits
from .._codes import ERRORS
from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from .._wire._json import JSONTooDeep, loads_bounded
from .._wire._protocol import REQUEST_TYPE, Op, b64decode
from ._requests import require, require_int

__all__ = [
    "PROTOCOL_LOG",
    "RateLimitedRefusal",
    "SignedRequest",
    "json_errors",
    "open_signed_request",
    "read_signed_request",
]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class SignedRequest:
    """A request whose signature verified; nothing else about it is checked yet."""

    op: Op  # from the path, equal to the signed "op"
    signer: str  # peer id whose key signed it
    counter: int  # replay counter (checked in the transaction)
    args: dict[str, Any]  # the operation's arguments
    token: Any  # the access token bytes, or anything a peer put there


async def read_signed_request(request: web.Request, run: str) -> SignedRequest:
    """Bound, decode and verify the body of a POST; raise RequestRefused (400/401/413)."""
    op = Op(request.path.rsplit("/", 1)[1])
    if (request.content_length or 0) > limits.MAX_REQUEST_BYTES:
        raise RequestRefused(
            E.TOO_LARGE, f"body over MAX_REQUEST_BYTES ({limits.MAX_REQUEST_BYTES})"
        )
    body = await request.read()
    try:
        outer = loads_bounded(body)
    except JSONTooDeep as exc:
        raise RequestRefused(E.TOO_DEEP, f"body: {exc}") from exc
    except ValueError as exc:  # UnicodeDecodeError included
        raise RequestRefused(E.MALFORMED_JSON, f"body is not JSON: {exc}") from exc
    if not isinstance(outer, dict) or not isinstance(outer.get("envelope"), str):
        raise RequestRefused(E.BAD_REQUEST, 'body must be {"envelope": "<base64>"}')
    return open_signed_request(outer["envelope"], op, run)


def open_signed_request(envelope: str, op: Op, run: str) -> SignedRequest:
    """Decode and verify one base64 ``cnode/request/v1`` envelope for ``op`` of ``run``
    (from a JSON body, or from the ``X-Cnode-Request`` header of an evidence upload)."""
    if len(envelope) > 4 * ((limits.MAX_ENVELOPE_BYTES + 2) // 3):
        raise RequestRefused(E.TOO_LARGE, "envelope over MAX_ENVELOPE_BYTES")
    try:
        data = b64decode(envelope)
    except ValueError as exc:
        raise RequestRefused(E.BAD_REQUEST, f"envelope: {exc}") from exc
    if len(data) > limits.MAX_ENVELOPE_BYTES:
        raise RequestRefused(E.TOO_LARGE, "envelope over MAX_ENVELOPE_BYTES")
    try:
        opened = open_envelope(data, expected_type=REQUEST_TYPE)
    except BadSignature as exc:
        raise RequestRefused(E.BAD_SIGNATURE, f"request signature: {exc}") from exc
    except EnvelopeError as exc:
        raise RequestRefused(E.BAD_ENVELOPE, f"request envelope: {exc}") from exc
    signer, p = opened.signer, opened.payload
    counter = require_int(p, "counter", 0, limits.MAX_COUNTER, "MAX_COUNTER")
    args = require(p, "args", dict)
    if require(p, "run", str) != run:
        raise RequestRefused(E.RUN_MISMATCH, "the signed request names another run")
    if require(p, "op", str) != op:
        raise RequestRefused(E.WRONG_OP, f"the signed request is for {p['op']!r}, not {str(op)!r}")
    return SignedRequest(op, signer, counter, args, p.get("token"))


class RateLimitedRefusal(RequestRefused):
    """429: come back later; the answer carries Retry-After. ``rate_limited`` (this peer's
    bucket is empty) unless another 429 code names the true cause (``busy``,
    ``evidence_share``)."""

    def __init__(
        self,
        wait: float,
        code: E = E.RATE_LIMITED,
        message: str = "too many requests from this peer",
    ) -> None:
        super().__init__(code, f"{message}; retry in {wait:.1f} s")
        self.retry_after = wait


# aiohttp's own refusals (no route, wrong method, body over client_max_size), as registered codes.
_HTTP_CODES = {404: E.NOT_FOUND, 405: E.METHOD_NOT_ALLOWED, 413: E.TOO_LARGE}


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every refusal becomes ``{"error": code, "message": text}`` with its status; every code
    is one of ``_codes.ErrorCode`` (specs/coordinator.md#status-codes)."""
    try:
        return await handler(request)
    except RequestRefused as exc:
        headers = {}
        if isinstance(exc, RateLimitedRefusal):
            headers["Retry-After"] = f"{max(1, round(exc.retry_after))}"
        if exc.status >= 500:
            log.warning("request_failed", code=exc.code, path=request.path)
        return web.json_response(
            {"error": str(exc.code), "message": exc.message}, status=exc.status, headers=headers
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, E.BAD_REQUEST)  # any other 4xx: the registry's 400
        return web.json_response(
            {"error": str(code), "message": exc.text or exc.reason}, status=ERRORS[code].status
        )


class _OneLineRefusals(logging.Filter):
    """aiohttp logs a request its parser refuses (a 64 KiB URL, a header over
    MAX_HEADER_FIELD_BYTES, bytes that are no HTTP) with a traceback, before it answers 400:
    the sender's fault, so one line at info, without the traceback. Anything else passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and (exc.code or 400) < 500:
            record.msg = "refused a malformed HTTP request: %s %s"
            record.args = (exc.code, str(exc.message)[:120])
            record.exc_info = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


# The logger aiohttp's connection handler writes to (AppRunner(logger=...)).
PROTOCOL_LOG = logging.getLogger("cnode.coordinator.http")
PROTOCOL_LOG.addFilter(_OneLineRefusals())
