"""Every error code the coordinator sends, with its HTTP status and meaning: the one registry.

A refusal is ``{"error": code, "message": text}`` (specs/coordinator.md#status-codes). The server
raises :class:`RequestRefused` with an :class:`ErrorCode`, whose status comes from
:data:`ERRORS`, so a code outside this table cannot be sent; the spec's Status codes table lists
the same codes with the same statuses (tests/node/coordinator/test_error_codes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ERRORS", "ErrorCode", "ErrorInfo"]


class ErrorCode(StrEnum):
    """A refusal's ``error`` field; its status and meaning are in :data:`ERRORS`."""

    MALFORMED_JSON = "malformed_json"
    BAD_REQUEST = "bad_request"
    BAD_ENVELOPE = "bad_envelope"
    BAD_CID = "bad_cid"
    BAD_ADDR = "bad_addr"
    RUN_MISMATCH = "run_mismatch"
    WRONG_OP = "wrong_op"
    BAD_EVIDENCE = "bad_evidence"
    TOO_DEEP = "too_deep"
    BAD_SIGNATURE = "bad_signature"
    BAD_TOKEN = "bad_token"
    BAD_BINDING = "bad_binding"
    HF_LOGIN_FAILED = "hf_login_failed"
    HF_USER_MISMATCH = "hf_user_mismatch"
    BANNED = "banned"
    NOT_ALLOWLISTED = "not_allowlisted"
    NOT_ADMIN = "not_admin"
    NOT_CHECKPOINTER = "not_checkpointer"
    UNKNOWN_RUN = "unknown_run"
    NOT_BANNED = "not_banned"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    TOO_SLOW = "too_slow"
    REPLAYED = "replayed"
    ROUND_OVER = "round_over"
    NOT_MEMBER = "not_member"
    ROUND_FULL = "round_full"
    ROUND_NOT_PUBLISHED = "round_not_published"
    WRONG_EPOCH = "wrong_epoch"
    STALE_ROUND = "stale_round"
    BAD_ACCUSED = "bad_accused"
    ALLOWLIST_FULL = "allowlist_full"
    UNKNOWN_CHECKPOINT = "unknown_checkpoint"
    NOT_PARTITIONED = "not_partitioned"
    PARTITIONED_ROUND = "partitioned_round"
    NOT_YOUR_PARTITION = "not_your_partition"
    RESULT_RECORDED = "result_recorded"
    RESULTS_PENDING = "results_pending"
    NOT_RECORDED = "not_recorded"
    RESULT_CORRECT = "result_correct"
    NO_EVIDENCE_CHECKER = "no_evidence_checker"
    EVIDENCE_REFUTED = "evidence_refuted"
    SCORE_RECORDED = "score_recorded"
    SCORES_CLOSED = "scores_closed"
    TOO_LARGE = "too_large"
    RATE_LIMITED = "rate_limited"
    BUSY = "busy"
    EVIDENCE_SHARE = "evidence_share"
    EVIDENCE_CHECK_FAILED = "evidence_check_failed"
    HF_TIMEOUT = "hf_timeout"


@dataclass(frozen=True)
class ErrorInfo:
    status: int  # the HTTP status every answer with this code has
    meaning: str  # one line, as in specs/coordinator.md#status-codes


_E = ErrorCode
ERRORS: dict[ErrorCode, ErrorInfo] = {
    _E.MALFORMED_JSON: ErrorInfo(400, "the body is not JSON"),
    _E.BAD_REQUEST: ErrorInfo(400, "a field is missing, of the wrong type or shape; names it"),
    _E.BAD_ENVELOPE: ErrorInfo(400, "the signed envelope (or a signed record in it) is malformed"),
    _E.BAD_CID: ErrorInfo(400, "a field that must be a CID is not one"),
    _E.BAD_ADDR: ErrorInfo(400, "an advertised address is not one the run accepts"),
    _E.RUN_MISMATCH: ErrorInfo(400, "the signed request names another run than the path"),
    _E.WRONG_OP: ErrorInfo(400, "the signed request is for another op than the path"),
    _E.BAD_EVIDENCE: ErrorInfo(400, "evidence the checker cannot use; the message says why"),
    _E.TOO_DEEP: ErrorInfo(400, "JSON nested deeper than MAX_JSON_DEPTH"),
    _E.BAD_SIGNATURE: ErrorInfo(401, "the request's signature does not verify"),
    _E.BAD_TOKEN: ErrorInfo(401, "access token missing, malformed, forged, expired or foreign"),
    _E.BAD_BINDING: ErrorInfo(401, "the HF binding does not verify or names another peer"),
    _E.HF_LOGIN_FAILED: ErrorInfo(401, "the HF Hub refused the token"),
    _E.HF_USER_MISMATCH: ErrorInfo(401, "the HF token belongs to another user than the binding"),
    _E.BANNED: ErrorInfo(403, "the peer (or its HF user) is banned"),
    _E.NOT_ALLOWLISTED: ErrorInfo(403, "the peer is not on the run's allowlist"),
    _E.NOT_ADMIN: ErrorInfo(403, "the signer is not an admin of the run"),
    _E.NOT_CHECKPOINTER: ErrorInfo(403, "the peer may not submit this round's checkpoint"),
    _E.UNKNOWN_RUN: ErrorInfo(404, "this coordinator serves another run"),
    _E.NOT_BANNED: ErrorInfo(404, "unban of a peer that is not banned"),
    _E.NOT_FOUND: ErrorInfo(404, "no such path"),
    _E.METHOD_NOT_ALLOWED: ErrorInfo(405, "the path does not take this method"),
    _E.TOO_SLOW: ErrorInfo(408, "an evidence upload ran past its deadline or under its rate"),
    _E.REPLAYED: ErrorInfo(409, "the request counter is not above the signer's last one"),
    _E.ROUND_OVER: ErrorInfo(409, "the round is closed to this change (or agreed)"),
    _E.NOT_MEMBER: ErrorInfo(409, "the peer is not a member of the round named"),
    _E.ROUND_FULL: ErrorInfo(409, "the round has MAX_ROUND_MEMBERS members"),
    _E.ROUND_NOT_PUBLISHED: ErrorInfo(409, "the round has no published member list"),
    _E.WRONG_EPOCH: ErrorInfo(409, "the checkpoint names another epoch than its round's"),
    _E.STALE_ROUND: ErrorInfo(409, "the checkpoint is not newer than the current one"),
    _E.BAD_ACCUSED: ErrorInfo(409, "the accused is not another member of the round"),
    _E.ALLOWLIST_FULL: ErrorInfo(409, "the allowlist has MAX_ALLOWLIST entries"),
    _E.UNKNOWN_CHECKPOINT: ErrorInfo(409, "a catch-up report names no recorded checkpoint"),
    _E.NOT_PARTITIONED: ErrorInfo(409, "a partitioned-round op in a full-replication round"),
    _E.PARTITIONED_ROUND: ErrorInfo(409, "`collected` in a partitioned round"),
    _E.NOT_YOUR_PARTITION: ErrorInfo(409, "neither the aggregator nor a backup whose time came"),
    _E.RESULT_RECORDED: ErrorInfo(409, "another result header stands for the partition"),
    _E.RESULTS_PENDING: ErrorInfo(409, "`checked` before every partition has a result"),
    _E.NOT_RECORDED: ErrorInfo(409, "evidence names a header that is not the recorded result"),
    _E.RESULT_CORRECT: ErrorInfo(409, "the recomputation agrees with the header: no ban"),
    _E.NO_EVIDENCE_CHECKER: ErrorInfo(409, "the server was started without an evidence checker"),
    _E.EVIDENCE_REFUTED: ErrorInfo(409, "the stored score records do not give the figures"),
    _E.SCORE_RECORDED: ErrorInfo(409, "another score record of this member stands"),
    _E.SCORES_CLOSED: ErrorInfo(409, "the round's score records are closed"),
    _E.TOO_LARGE: ErrorInfo(413, "body, envelope, record or evidence over its byte bound"),
    _E.RATE_LIMITED: ErrorInfo(429, "this peer's request bucket is empty; see Retry-After"),
    _E.BUSY: ErrorInfo(429, "every evidence check is in use (by others); see Retry-After"),
    _E.EVIDENCE_SHARE: ErrorInfo(429, "this peer holds its share of the evidence checks"),
    _E.EVIDENCE_CHECK_FAILED: ErrorInfo(500, "the evidence checker itself failed (ours)"),
    _E.HF_TIMEOUT: ErrorInfo(504, "the HF Hub did not answer whoami in time"),
}
