"""Errors of the coordinator and its client.

::

    cnode.CnodeError
    └── CoordinatorError
        ├── RunConfigError          the run config or key file is wrong (local, fix the file)
        ├── RequestRefused          server side: a request is refused; becomes a 4xx JSON answer
        ├── BadEvidence             server side: an evidence checker found the evidence malformed
        ├── CoordinatorUnavailable  the coordinator cannot be reached or answered garbage (network)
        ├── CoordinatorRejected     the coordinator refused a request: .status, .code, .message
        │   └── RateLimited         429; .retry_after_s says when to try again
        └── BadRunState             state that fails verification: missing/bad signature, other
                                    signer than the pinned coordinator, other run (remote's fault)
"""

from __future__ import annotations

from cnode.node._exceptions import NodeError

from ._codes import ERRORS, ErrorCode

__all__ = [
    "BadEvidence",
    "BadRunState",
    "CoordinatorError",
    "CoordinatorRejected",
    "CoordinatorUnavailable",
    "RateLimited",
    "RequestRefused",
    "RunConfigError",
]


class CoordinatorError(NodeError):
    """Raised by the coordinator or its client; the root of this package's tree."""


class RunConfigError(CoordinatorError):
    """Raised when a run config or coordinator key file is missing, unreadable or wrong."""


class CoordinatorUnavailable(CoordinatorError):
    """Raised by the client when the coordinator cannot be reached or sends a non-JSON answer."""


class CoordinatorRejected(CoordinatorError):
    """Raised by the client when the coordinator answers a request with an error status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"coordinator refused ({status} {code}): {message}")
        self.status = status
        # Decoded through the registry: callers compare with ``ErrorCode`` members (a code this
        # version does not know, from a newer coordinator, stays its text).
        self.code: ErrorCode | str = ErrorCode(code) if code in ERRORS else code
        self.message = message


class RateLimited(CoordinatorRejected):
    """Raised by the client on 429: this peer sent too many requests; wait ``retry_after_s``."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float) -> None:
        super().__init__(status, code, message)
        self.retry_after_s = retry_after_s


class BadRunState(CoordinatorError):
    """Raised by the client when signed state fails verification (bad, missing or foreign key)."""


class RequestRefused(CoordinatorError):
    """Raised inside the server when a request must be refused (the requester's fault).

    The transaction it escapes from is rolled back, so a refused request changes nothing; the
    server answers ``status`` with ``{"error": code, "message": message}``. The status is the
    code's in the registry (``_codes.ERRORS``): no code outside it can be sent.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)  # a string outside the registry raises ValueError here
        self.status = ERRORS[self.code].status
        self.message = message


class BadEvidence(CoordinatorError):
    """Raised by an evidence checker (``ServeSettings.evidence_checker``) when the CAR of a
    `wrong_result` request is malformed, a block does not match its CID, blocks are missing, or
    the header is not a partition result of the run, round and partition named; the endpoint
    answers 400 ``bad_evidence`` with the message."""
