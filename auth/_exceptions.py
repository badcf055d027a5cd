"""Exceptions of :mod:`cnode.auth`.

::

    CnodeError
    └── AuthError
        ├── IdentityError          a key file is missing, too open, truncated or not Ed25519
        ├── PeerIdError            a peer id is not a canonical Ed25519 identity-multihash id
        ├── EncodeError            local misuse: a payload cannot be sealed (type, size, kinds)
        ├── EnvelopeError          a received envelope was refused; the subclass says why
        │   ├── MalformedEnvelope      bytes are not one canonical, bounded envelope
        │   ├── UnknownPayloadType     the payload type is unknown or not the one expected
        │   ├── BadSignature           the signature does not verify under the signer's key
        │   └── WrongSigner            a valid signature, but by someone else than expected
        ├── ReplayError            a signed message was seen before (duplicate) or is older (stale)
        ├── TokenError             an access token is expired, forged, for another run or malformed
        ├── BindingError           an HF binding's payload is inconsistent with its signer
        └── HFLoginError           the Hub refused the token or could not be reached

Remote parties cause EnvelopeError, ReplayError, TokenError and BindingError; the local user or
caller causes IdentityError, EncodeError and (usually) HFLoginError. No message ever contains a
private key or an HF token.
"""

from __future__ import annotations

from enum import StrEnum

from cnode import CnodeError


class AuthError(CnodeError):
    """Raised by cnode.auth when a key, signature, token or login cannot be used."""


class IdentityError(AuthError):
    """Raised by the key-file functions when a key file cannot be used; the message names it."""


class PeerIdError(AuthError):
    """Raised when a peer id string is not a canonical base58 Ed25519 identity-multihash id."""


class EncodeError(AuthError):
    """Raised by seal (local misuse) when a payload cannot be encoded within the limits."""


class EnvelopeError(AuthError):
    """Raised by open_envelope when an envelope is refused; the subclass says why."""


class MalformedEnvelope(EnvelopeError):
    """Raised when the bytes are not one bounded, canonical DAG-CBOR envelope."""


class UnknownPayloadType(EnvelopeError):
    """Raised when the payload type is not a known one, or not the one the caller expected."""


class BadSignature(EnvelopeError):
    """Raised when the signature does not verify under the public key in the signer's peer id."""


class WrongSigner(EnvelopeError):
    """Raised when a well-signed envelope was signed by another peer than the one expected."""


class ReplayError(AuthError):
    """Raised by ReplayGuard when a message was seen before or is older than one already seen."""


class TokenReason(StrEnum):
    """Why an access token was refused (``TokenError.reason``)."""

    MALFORMED = "malformed"  # not a well-formed access-token envelope or payload
    FORGED = "forged"  # the signature does not verify
    WRONG_COORDINATOR = "wrong-coordinator"  # signed, but not by the pinned coordinator
    WRONG_RUN = "wrong-run"  # issued for another run
    EXPIRED = "expired"  # now >= expires_at


class TokenError(AuthError):
    """Raised by verify_access_token when a token is refused; ``.reason`` says why."""

    def __init__(self, reason: TokenReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class BindingError(AuthError):
    """Raised by verify_hf_binding when a binding's payload disagrees with its signer."""


class HFLoginReason(StrEnum):
    """Why an HF login failed (``HFLoginError.reason``)."""

    BAD_TOKEN = "bad-token"  # 401: unknown, malformed, expired or revoked token
    UNREACHABLE = "unreachable"  # connection refused, DNS failure, timeout
    BAD_RESPONSE = "bad-response"  # the endpoint answered, but not like the Hub does


class HFLoginError(AuthError):
    """Raised by hf_whoami when the Hub refuses the token or cannot be reached; no token inside."""

    def __init__(self, reason: HFLoginReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
