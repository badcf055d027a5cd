"""Access tokens: the coordinator's signed admission of one peer to one run.

See specs/identity.md#access-tokens. A token is an envelope of type ``cnode/access-token/v1`` signed
by the coordinator key pinned in the run configuration. Times are integer Unix seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import limits
from ._envelope import ACCESS_TOKEN_TYPE, open_envelope, seal
from ._exceptions import (
    BadSignature,
    EncodeError,
    EnvelopeError,
    PeerIdError,
    TokenError,
    TokenReason,
    UnknownPayloadType,
    WrongSigner,
)
from ._identity import Identity, public_key_from_peer_id

_TOKEN_KEYS = frozenset({"expires_at", "peer", "run", "username"})


@dataclass(frozen=True)
class AccessToken:
    """A verified access token."""

    peer_id: str  # the admitted peer (base58btc)
    username: str  # its HF username (as the coordinator checked it)
    run: str  # the run it may take part in
    expires_at: int  # Unix seconds; invalid from this second on


def _check_text(name: str, value: Any, max_len: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_len:
        raise ValueError(f"{name} must be a string of 1..{max_len} characters")
    return value


def issue_access_token(
    coordinator: Identity, *, peer_id: str, username: str, run: str, expires_at: int
) -> bytes:
    """Sign an access token for ``peer_id`` in ``run`` until ``expires_at`` (Unix seconds)."""
    public_key_from_peer_id(peer_id)  # PeerIdError for anything but an Ed25519 peer id
    try:
        _check_text("username", username, limits.MAX_USERNAME_LEN)
        _check_text("run", run, limits.MAX_RUN_ID_LEN)
        if isinstance(expires_at, bool) or not isinstance(expires_at, int) or expires_at < 0:
            raise ValueError("expires_at must be a non-negative integer (Unix seconds)")
    except ValueError as exc:
        raise EncodeError(f"cannot issue access token: {exc}") from exc
    payload = {"expires_at": expires_at, "peer": peer_id, "run": run, "username": username}
    return seal(coordinator, ACCESS_TOKEN_TYPE, payload)


def verify_access_token(
    token: bytes, *, coordinator_peer_id: str, run: str, now: float
) -> AccessToken:
    """Verify ``token`` as issued by ``coordinator_peer_id`` for ``run`` and valid at ``now``.

    Raises:
        TokenError: ``.reason`` is MALFORMED, FORGED (bad signature), WRONG_COORDINATOR,
            WRONG_RUN or EXPIRED; the message says which.
    """
    if len(token) > limits.MAX_TOKEN_SIZE:
        raise TokenError(
            TokenReason.MALFORMED,
            f"access token of {len(token)} bytes exceeds MAX_TOKEN_SIZE {limits.MAX_TOKEN_SIZE}",
        )
    try:
        opened = open_envelope(
            token, expected_type=ACCESS_TOKEN_TYPE, expected_signer=coordinator_peer_id
        )
    except WrongSigner as exc:
        raise TokenError(
            TokenReason.WRONG_COORDINATOR,
            f"access token not issued by this run's coordinator: {exc}",
        ) from exc
    except BadSignature as exc:
        raise TokenError(TokenReason.FORGED, f"forged access token: {exc}") from exc
    except UnknownPayloadType as exc:
        raise TokenError(TokenReason.MALFORMED, f"not an access token: {exc}") from exc
    except EnvelopeError as exc:
        raise TokenError(TokenReason.MALFORMED, f"malformed access token: {exc}") from exc
    p = opened.payload
    try:
        if set(p) != _TOKEN_KEYS:
            raise ValueError(f"fields {sorted(p)}, expected {sorted(_TOKEN_KEYS)}")
        peer = _check_text("peer", p["peer"], 128)
        public_key_from_peer_id(peer)
        username = _check_text("username", p["username"], limits.MAX_USERNAME_LEN)
        token_run = _check_text("run", p["run"], limits.MAX_RUN_ID_LEN)
        expires_at = p["expires_at"]
        if isinstance(expires_at, bool) or not isinstance(expires_at, int):
            raise ValueError("expires_at must be an integer")
    except (ValueError, PeerIdError) as exc:
        raise TokenError(TokenReason.MALFORMED, f"malformed access token: {exc}") from exc
    if token_run != run:
        raise TokenError(
            TokenReason.WRONG_RUN, f"access token is for run {token_run!r}, not {run!r}"
        )
    if now >= expires_at:
        raise TokenError(
            TokenReason.EXPIRED,
            f"access token of {peer} expired at {expires_at} ({int(now - expires_at)} s ago)",
        )
    return AccessToken(peer_id=peer, username=username, run=token_run, expires_at=expires_at)
