"""Hugging Face login: who a token belongs to, and the signed binding of a peer id to that user.

See specs/identity.md#hf-binding. ``hf_whoami`` calls the real ``huggingface_hub`` client against
``endpoint`` (default ``$HF_ENDPOINT``, else the Hub). The token is sent only in the
Authorization header and never appears in a message, a log line or an exception: errors are built
from status codes and our own words, never from the client's text.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any

from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from . import limits
from ._envelope import HF_BINDING_TYPE, open_envelope, seal
from ._exceptions import BindingError, EncodeError, HFLoginError, HFLoginReason
from ._identity import Identity

DEFAULT_HF_ENDPOINT = "https://huggingface.co"


def _transport_errors() -> tuple[type[Exception], ...]:
    """Connection-level errors of the HTTP library the installed huggingface_hub uses.

    huggingface_hub 2.x uses httpx2, 1.x httpx, 0.x requests (whose errors are OSErrors).
    """
    found: list[type[Exception]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


# Connection-level errors of the installed huggingface_hub's HTTP library (node/hub uses it too).
HF_TRANSPORT_ERRORS = _transport_errors()
_BINDING_KEYS = frozenset({"at", "peer", "username"})


@dataclass(frozen=True)
class HFAccount:
    """The user a token belongs to."""

    username: str  # the Hub's "name" field
    orgs: list[str] = field(default_factory=list)  # names of the user's organizations


@dataclass(frozen=True)
class HFBinding:
    """A verified binding: ``peer_id`` claims HF user ``username`` since ``at``."""

    peer_id: str  # signer, base58btc
    username: str  # HF username
    at: int  # Unix seconds when the binding was made


def resolve_endpoint(endpoint: str | None) -> str:
    """``endpoint``, else ``$HF_ENDPOINT``, else the Hub; without a trailing slash."""
    chosen = endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT
    return chosen.rstrip("/")


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "[redacted]") if token else text


def hf_whoami(token: str, endpoint: str | None = None) -> HFAccount:
    """Ask the Hub at ``endpoint`` whose token ``token`` is.

    Raises:
        HFLoginError: ``.reason`` BAD_TOKEN (401/403: unknown, expired or revoked token),
            UNREACHABLE (no connection, timeout) or BAD_RESPONSE (not a Hub answer).
    """
    url = resolve_endpoint(endpoint)
    if not token or not token.strip() or any(c.isspace() for c in token):
        raise HFLoginError(HFLoginReason.BAD_TOKEN, "the HF token is empty or contains spaces")
    api = HfApi(endpoint=url, library_name="cnode")
    try:
        info: Any = api.whoami(token=token)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise HFLoginError(
                HFLoginReason.BAD_TOKEN,
                f"the Hugging Face Hub at {url} rejected the token (HTTP {status}): it is "
                f"invalid, expired or revoked; create a new one at {url}/settings/tokens",
            ) from None
        raise HFLoginError(
            HFLoginReason.BAD_RESPONSE,
            f"the Hugging Face Hub at {url} answered whoami with HTTP {status}",
        ) from None
    except HF_TRANSPORT_ERRORS as exc:
        # from None: the chained exception would carry the request, headers and all.
        raise HFLoginError(
            HFLoginReason.UNREACHABLE,
            f"cannot reach the Hugging Face Hub at {url}: {_scrub(type(exc).__name__, token)}",
        ) from None
    except ValueError:  # the body was not JSON
        raise HFLoginError(
            HFLoginReason.BAD_RESPONSE, f"the Hugging Face Hub at {url} sent a non-JSON answer"
        ) from None
    return _account(info, url)


def _account(info: Any, url: str) -> HFAccount:
    if not isinstance(info, dict):
        raise HFLoginError(HFLoginReason.BAD_RESPONSE, f"whoami answer from {url} is not an object")
    name = info.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= limits.MAX_USERNAME_LEN:
        raise HFLoginError(HFLoginReason.BAD_RESPONSE, f"whoami answer from {url} has no user name")
    if info.get("type", "user") != "user":
        raise HFLoginError(
            HFLoginReason.BAD_TOKEN,
            f"the token belongs to a {info.get('type')!r}, not a user; use a user access token",
        )
    orgs_raw = info.get("orgs") or []
    if not isinstance(orgs_raw, list):
        raise HFLoginError(HFLoginReason.BAD_RESPONSE, f"whoami answer from {url}: bad orgs")
    orgs = [
        o["name"]
        for o in orgs_raw[: limits.MAX_HF_ORGS]
        if isinstance(o, dict) and isinstance(o.get("name"), str)
    ]
    return HFAccount(username=name, orgs=orgs)


def make_hf_binding(identity: Identity, username: str, at: int) -> bytes:
    """Sign ``{peer, username, at}`` with ``identity``: this node claims HF user ``username``."""
    if not isinstance(username, str) or not 1 <= len(username) <= limits.MAX_USERNAME_LEN:
        raise EncodeError(f"HF username must be 1..{limits.MAX_USERNAME_LEN} characters")
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise EncodeError("binding time must be a non-negative integer (Unix seconds)")
    payload = {"at": at, "peer": identity.peer_id_str, "username": username}
    return seal(identity, HF_BINDING_TYPE, payload)


def verify_hf_binding(data: bytes, *, expected_peer: str | None = None) -> HFBinding:
    """Verify a binding made by :func:`make_hf_binding`.

    Raises:
        EnvelopeError subclasses: malformed, not a binding, bad signature, or (with
            ``expected_peer``) signed by another peer.
        BindingError: the payload's fields are wrong or its ``peer`` is not the signer.
    """
    if len(data) > limits.MAX_BINDING_SIZE:
        raise BindingError(
            f"HF binding of {len(data)} bytes exceeds MAX_BINDING_SIZE {limits.MAX_BINDING_SIZE}"
        )
    opened = open_envelope(data, expected_type=HF_BINDING_TYPE, expected_signer=expected_peer)
    p = opened.payload
    if set(p) != _BINDING_KEYS:
        raise BindingError(f"HF binding has fields {sorted(p)}, expected {sorted(_BINDING_KEYS)}")
    username, at, peer = p["username"], p["at"], p["peer"]
    if not isinstance(username, str) or not 1 <= len(username) <= limits.MAX_USERNAME_LEN:
        raise BindingError("HF binding: username must be a short non-empty string")
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise BindingError("HF binding: at must be a non-negative integer")
    if peer != opened.signer:
        raise BindingError(f"HF binding names peer {peer!r} but is signed by {opened.signer}")
    return HFBinding(peer_id=peer, username=username, at=at)
