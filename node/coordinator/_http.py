"""HTTP plumbing of the coordinator: reading a signed request, and refusals as JSON.

aiohttp and auth exceptions are translated here and only here (specs/coordinator.md#errors).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from cnode.auth import BadSignature, EnvelopeError, open_envelope

from . import limits
from ._exceptions import RequestRefused
from ._protocol import REQUEST_TYPE, Op, b64decode
from ._requests import require

__all__ = [
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
            413, "too_large", f"body over MAX_REQUEST_BYTES ({limits.MAX_REQUEST_BYTES})"
        )
    body = await request.read()
    try:
        outer = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestRefused(400, "malformed_json", f"body is not JSON: {exc}") from exc
    if not isinstance(outer, dict) or not isinstance(outer.get("envelope"), str):
        raise RequestRefused(400, "bad_request", 'body must be {"envelope": "<base64>"}')
    return open_signed_request(outer["envelope"], op, run)


def open_signed_request(envelope: str, op: Op, run: str) -> SignedRequest:
    """Decode and verify one base64 ``cnode/request/v1`` envelope for ``op`` of ``run``
    (from a JSON body, or from the ``X-Cnode-Request`` header of an evidence upload)."""
    if len(envelope) > 4 * ((limits.MAX_ENVELOPE_BYTES + 2) // 3):
        raise RequestRefused(413, "too_large", "envelope over MAX_ENVELOPE_BYTES")
    try:
        data = b64decode(envelope)
    except ValueError as exc:
        raise RequestRefused(400, "bad_request", f"envelope: {exc}") from exc
    if len(data) > limits.MAX_ENVELOPE_BYTES:
        raise RequestRefused(413, "too_large", "envelope over MAX_ENVELOPE_BYTES")
    try:
        opened = open_envelope(data, expected_type=REQUEST_TYPE)
    except BadSignature as exc:
        raise RequestRefused(401, "bad_signature", f"request signature: {exc}") from exc
    except EnvelopeError as exc:
        raise RequestRefused(400, "bad_envelope", f"request envelope: {exc}") from exc
    signer, p = opened.signer, opened.payload
    counter = require(p, "counter", int)
    args = require(p, "args", dict)
    if require(p, "run", str) != run:
        raise RequestRefused(400, "run_mismatch", "the signed request names another run")
    if require(p, "op", str) != op:
        raise RequestRefused(
            400, "wrong_op", f"the signed request is for {p['op']!r}, not {str(op)!r}"
        )
    return SignedRequest(op, signer, counter, args, p.get("token"))


class RateLimitedRefusal(RequestRefused):
    """429: this peer's bucket is empty; the answer carries Retry-After."""

    def __init__(self, wait: float) -> None:
        super().__init__(
            429, "rate_limited", f"too many requests from this peer; retry in {wait:.1f} s"
        )
        self.retry_after = wait


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every refusal becomes ``{"error": code, "message": text}`` with its status."""
    try:
        return await handler(request)
    except RequestRefused as exc:
        headers = {}
        if isinstance(exc, RateLimitedRefusal):
            headers["Retry-After"] = f"{max(1, round(exc.retry_after))}"
        if exc.status >= 500:
            log.warning("request_failed", code=exc.code, path=request.path)
        return web.json_response(
            {"error": exc.code, "message": exc.message}, status=exc.status, headers=headers
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "too_large" if exc.status == 413 else exc.reason.lower().replace(" ", "_")
        return web.json_response(
            {"error": code, "message": exc.text or exc.reason}, status=exc.status
        )
