"""cnode.auth: keys, peer ids, signed envelopes, replay guard, access tokens, HF login binding.

See specs/identity.md. No network I/O except :func:`hf_whoami` (one HTTPS call to the Hub).
"""

from ._envelope import ACCESS_TOKEN_TYPE as ACCESS_TOKEN_TYPE
from ._envelope import DOMAIN as DOMAIN
from ._envelope import HF_BINDING_TYPE as HF_BINDING_TYPE
from ._envelope import PAYLOAD_TYPES as PAYLOAD_TYPES
from ._envelope import Opened as Opened
from ._envelope import open_envelope as open_envelope
from ._envelope import seal as seal
from ._exceptions import AuthError as AuthError
from ._exceptions import BadSignature as BadSignature
from ._exceptions import BindingError as BindingError
from ._exceptions import EncodeError as EncodeError
from ._exceptions import EnvelopeError as EnvelopeError
from ._exceptions import HFLoginError as HFLoginError
from ._exceptions import HFLoginReason as HFLoginReason
from ._exceptions import IdentityError as IdentityError
from ._exceptions import MalformedEnvelope as MalformedEnvelope
from ._exceptions import PeerIdError as PeerIdError
from ._exceptions import ReplayError as ReplayError
from ._exceptions import TokenError as TokenError
from ._exceptions import TokenReason as TokenReason
from ._exceptions import UnknownPayloadType as UnknownPayloadType
from ._exceptions import WrongSigner as WrongSigner
from ._hf import HF_TRANSPORT_ERRORS as HF_TRANSPORT_ERRORS
from ._hf import HFAccount as HFAccount
from ._hf import HFBinding as HFBinding
from ._hf import hf_whoami as hf_whoami
from ._hf import make_hf_binding as make_hf_binding
from ._hf import resolve_endpoint as resolve_hf_endpoint
from ._hf import verify_hf_binding as verify_hf_binding
from ._identity import Identity as Identity
from ._identity import load_identity as load_identity
from ._identity import peer_id_from_public_key as peer_id_from_public_key
from ._identity import public_key_from_peer_id as public_key_from_peer_id
from ._identity import save_identity as save_identity
from ._replay import ReplayGuard as ReplayGuard
from ._token import AccessToken as AccessToken
from ._token import issue_access_token as issue_access_token
from ._token import verify_access_token as verify_access_token

__all__ = [  # noqa: RUF022 (plain sorted(), checked by tests/auth/test_exports.py)
    "ACCESS_TOKEN_TYPE",
    "AccessToken",
    "AuthError",
    "BadSignature",
    "BindingError",
    "DOMAIN",
    "EncodeError",
    "EnvelopeError",
    "HFAccount",
    "HFBinding",
    "HFLoginError",
    "HFLoginReason",
    "HF_BINDING_TYPE",
    "HF_TRANSPORT_ERRORS",
    "Identity",
    "IdentityError",
    "MalformedEnvelope",
    "Opened",
    "PAYLOAD_TYPES",
    "PeerIdError",
    "ReplayError",
    "ReplayGuard",
    "TokenError",
    "TokenReason",
    "UnknownPayloadType",
    "WrongSigner",
    "hf_whoami",
    "issue_access_token",
    "load_identity",
    "make_hf_binding",
    "open_envelope",
    "peer_id_from_public_key",
    "public_key_from_peer_id",
    "resolve_hf_endpoint",
    "save_identity",
    "seal",
    "verify_access_token",
    "verify_hf_binding",
]
