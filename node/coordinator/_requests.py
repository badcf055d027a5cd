"""Decoding of request arguments (the ``args`` map of a ``cnode/request/v1`` payload).

Each function checks types and bounds and raises :class:`RequestRefused` (400) naming the field.
See specs/coordinator.md#messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cnode.aggregation import EvidenceKind
from cnode.auth import EnvelopeError, open_envelope
from cnode.storage import CID, StorageError

from . import limits
from ._admin import (
    AdminAction,
    AllowlistAdd,
    AllowlistList,
    AllowlistRemove,
    BanPeer,
    LogPage,
    UnbanPeer,
)
from ._exceptions import RequestRefused
from ._protocol import CheckpointRecord, b64decode

__all__ = [
    "parse_admin",
    "parse_checkpoint",
    "parse_evidence",
    "parse_header",
    "parse_missing",
    "parse_partition",
    "parse_result",
    "parse_round",
    "parse_score",
    "parse_wrong",
    "parse_wrong_result",
    "require",
]

SCORE_RECORD_TYPE = "cnode/score-record/v1"  # node/train/scores/_records.py

_ADMIN_ACTIONS = ("allowlist.add", "allowlist.remove", "allowlist.ls", "ban", "unban", "log")
_ALLOW_KINDS = ("user", "peer", "org")
_EVIDENCE_KINDS = tuple(str(k) for k in EvidenceKind)


def require(p: Mapping[str, Any], key: str, typ: type, *, optional: bool = False) -> Any:
    value = p.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise RequestRefused(400, "bad_request", f"field {key!r} must be {typ.__name__}")
    if isinstance(value, str) and len(value) > limits.MAX_TEXT_CHARS:
        raise RequestRefused(400, "bad_request", f"field {key!r} over MAX_TEXT_CHARS")
    return value


def _text(p: Mapping[str, Any], key: str) -> str:
    value: str = require(p, key, str)
    if not value.strip():
        raise RequestRefused(400, "bad_request", f"field {key!r} is empty")
    return value


def _cid(p: Mapping[str, Any], key: str) -> str:
    text = _text(p, key)
    if len(text) > limits.MAX_CID_CHARS:
        raise RequestRefused(400, "bad_request", f"field {key!r} over MAX_CID_CHARS")
    try:
        return str(CID.parse(text))
    except StorageError as exc:
        raise RequestRefused(400, "bad_cid", f"field {key!r} is not a CID: {exc}") from exc


def parse_round(args: Mapping[str, Any]) -> int:
    n: int = require(args, "round", int)
    if n < 1:
        raise RequestRefused(400, "bad_request", "round must be >= 1")
    return n


def parse_header(args: Mapping[str, Any]) -> str | None:
    """The optional update-header CID a member sends with ``ready``."""
    return None if args.get("header") is None else _cid(args, "header")


def parse_missing(args: Mapping[str, Any]) -> list[str]:
    """The peer ids of a `collected` report: members whose update the sender could not fetch."""
    missing = args.get("missing")
    if not isinstance(missing, list) or not all(isinstance(p, str) for p in missing):
        raise RequestRefused(400, "bad_request", "field 'missing' must be a list of peer ids")
    if len(missing) > limits.MAX_MISSING_REPORT:
        raise RequestRefused(400, "bad_request", "field 'missing' over MAX_MISSING_REPORT")
    if any(len(p) > limits.MAX_TEXT_CHARS for p in missing):
        raise RequestRefused(400, "bad_request", "a peer id in 'missing' is over MAX_TEXT_CHARS")
    return missing


def parse_partition(args: Mapping[str, Any]) -> int:
    """A partition index (>= 0; the round's ``parts`` bounds it above, checked by the caller)."""
    p: int = require(args, "partition", int)
    if p < 0:
        raise RequestRefused(400, "bad_request", "field 'partition' must be >= 0")
    return p


def parse_result(args: Mapping[str, Any]) -> tuple[int, int, str]:
    """`result` {round, partition, header}: the partition result header CID an aggregator made."""
    return parse_round(args), parse_partition(args), _cid(args, "header")


def parse_score(args: Mapping[str, Any], peer: str) -> tuple[int, bytes]:
    """`score` {round, record}: the signed score record ``peer`` made (base64 of the envelope,
    at most MAX_SCORE_RECORD_BYTES, a ``cnode/score-record/v1`` signed by ``peer``). Its payload
    is the nodes' to judge (the coordinator never imports the training package)."""
    n = parse_round(args)
    try:
        data = b64decode(args.get("record"))
    except ValueError as exc:
        raise RequestRefused(400, "bad_request", f"field 'record' is not base64: {exc}") from exc
    if len(data) > limits.MAX_SCORE_RECORD_BYTES:
        raise RequestRefused(
            413, "too_large", f"score record over MAX_SCORE_RECORD_BYTES ({len(data)} bytes)"
        )
    try:
        open_envelope(data, expected_type=SCORE_RECORD_TYPE, expected_signer=peer)
    except EnvelopeError as exc:
        raise RequestRefused(400, "bad_envelope", f"field 'record': {exc}") from exc
    return n, data


def parse_wrong(args: Mapping[str, Any]) -> list[int]:
    """`checked` {round, wrong}: the partitions a member recomputed and found wrong (sorted)."""
    wrong = args.get("wrong")
    if not isinstance(wrong, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in wrong
    ):
        raise RequestRefused(400, "bad_request", "field 'wrong' must be a list of partitions")
    if len(wrong) > limits.MAX_ROUND_MEMBERS:
        raise RequestRefused(400, "bad_request", "field 'wrong' over MAX_ROUND_MEMBERS")
    if len(set(wrong)) != len(wrong) or any(p < 0 for p in wrong):
        raise RequestRefused(400, "bad_request", "field 'wrong' must name distinct partitions >= 0")
    return sorted(wrong)


def parse_wrong_result(args: Mapping[str, Any]) -> tuple[int, int, str, str]:
    """`wrong_result` {round, partition, header, output}: evidence against a partition result;
    ``output`` is the output CID the reporter's own recomputation gives ("" for none)."""
    output = require(args, "output", str)
    output = _cid(args, "output") if output else ""
    return parse_round(args), parse_partition(args), _cid(args, "header"), output


def parse_checkpoint(args: Mapping[str, Any], peer: str) -> CheckpointRecord:
    epoch: int = require(args, "epoch", int)
    hf_repo = require(args, "hf_repo", str, optional=True)
    hf_revision = require(args, "hf_revision", str, optional=True)
    if (hf_repo is None) != (hf_revision is None):
        raise RequestRefused(400, "bad_request", "hf_repo and hf_revision go together")
    return CheckpointRecord(
        epoch, parse_round(args), _cid(args, "manifest"), hf_repo, hf_revision, peer, 0
    )


def parse_evidence(args: Mapping[str, Any]) -> dict[str, Any]:
    """A BanRecommendation payload: {peer, round, kind, reason, update_cid|None, figures}."""
    kind = require(args, "kind", str)
    if kind not in _EVIDENCE_KINDS:
        raise RequestRefused(400, "bad_request", f"kind must be one of {_EVIDENCE_KINDS}")
    update = None if args.get("update_cid") is None else _cid(args, "update_cid")
    figures = args.get("figures", "{}")
    if isinstance(figures, Mapping):
        figures = json.dumps(figures, sort_keys=True, default=str)
    if not isinstance(figures, str) or len(figures) > limits.MAX_FIGURES_CHARS:
        raise RequestRefused(
            400, "bad_request", "figures must be JSON text within MAX_FIGURES_CHARS"
        )
    return {
        "peer": _text(args, "peer"),
        "round": parse_round(args),
        "kind": EvidenceKind(kind),
        "reason": _text(args, "reason"),
        "update_cid": update,
        "figures": figures,
    }


def parse_admin(args: Mapping[str, Any]) -> AdminAction:
    """The typed admin action of a request's ``args`` (400 naming what is wrong)."""
    action = require(args, "action", str)
    if action not in _ADMIN_ACTIONS:
        raise RequestRefused(400, "bad_request", f"unknown admin action {action[:40]!r}")
    if action in ("allowlist.add", "allowlist.remove"):
        kind = require(args, "kind", str)
        if kind not in _ALLOW_KINDS:
            raise RequestRefused(400, "bad_request", f"kind must be one of {_ALLOW_KINDS}")
        value = _text(args, "value")
        if action == "allowlist.add":
            return AllowlistAdd(kind, value)
        return AllowlistRemove(kind, value)
    if action == "ban":
        return BanPeer(_text(args, "peer"), _text(args, "reason"))
    if action == "unban":
        return UnbanPeer(_text(args, "peer"))
    if action == "log":
        after = require(args, "after", int, optional=True) or 0
        limit = require(args, "limit", int, optional=True) or limits.MAX_LOG_PAGE
        return LogPage(after, max(1, min(limit, limits.MAX_LOG_PAGE)))
    return AllowlistList()
