"""Decoding of request arguments (the ``args`` map of a ``cnode/request/v1`` payload).

Each function checks types and bounds and raises :class:`RequestRefused` (400) naming the field.
See specs/coordinator.md#messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from cnode.aggregation import EvidenceKind
from cnode.auth import EnvelopeError, open_envelope
from cnode.storage import CID, StorageError

from .. import limits
from .._codes import ErrorCode as E
from .._exceptions import RequestRefused
from .._wire._admin import (
    AdminAction,
    AdminVerb,
    AllowKind,
    AllowlistAdd,
    AllowlistList,
    AllowlistRemove,
    BanPeer,
    LogPage,
    UnbanPeer,
)
from .._wire._json import json_depth
from .._wire._protocol import CheckpointRecord, b64decode

__all__ = [
    "bounded",
    "int_text",
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
    "require_int",
]

SCORE_RECORD_TYPE = "cnode/score-record/v1"  # node/train/scores/_records.py

_EVIDENCE_KINDS = tuple(str(k) for k in EvidenceKind)


def require(p: Mapping[str, Any], key: str, typ: type, *, optional: bool = False) -> Any:
    value = p.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise RequestRefused(E.BAD_REQUEST, f"field {key!r} must be {typ.__name__}")
    if isinstance(value, str) and len(value) > limits.MAX_TEXT_CHARS:
        raise RequestRefused(E.BAD_REQUEST, f"field {key!r} over MAX_TEXT_CHARS")
    return value


def bounded(value: int, name: str, lo: int, hi: int, bound: str) -> int:
    """``value`` if ``lo <= value <= hi``, else 400 naming ``name`` and the limit ``bound``."""
    if value < lo:
        raise RequestRefused(E.BAD_REQUEST, f"{name} must be >= {lo}")
    if value > hi:
        raise RequestRefused(E.BAD_REQUEST, f"{name} must be at most {bound} ({hi})")
    return value


def require_int(p: Mapping[str, Any], key: str, lo: int, hi: int, bound: str) -> int:
    """The int field ``key`` of ``p``, within [lo, hi] (``bound`` names hi's limit)."""
    return bounded(require(p, key, int), f"field {key!r}", lo, hi, bound)


_INT_TEXT = re.compile(r"-?[0-9]+")


def int_text(text: str, name: str, lo: int, hi: int, bound: str) -> int:
    """An integer of a path or query string (ASCII digits only: ``int()`` alone also takes
    ``1_000``, spaces and other scripts' digits), within [lo, hi]."""
    if not _INT_TEXT.fullmatch(text):
        raise RequestRefused(E.BAD_REQUEST, f"{name} must be an integer")
    if len(text.lstrip("-")) > limits.MAX_INT_DIGITS:
        raise RequestRefused(E.BAD_REQUEST, f"{name} must be at most {bound} ({hi})")
    return bounded(int(text), name, lo, hi, bound)


def _text(p: Mapping[str, Any], key: str) -> str:
    value: str = require(p, key, str)
    if not value.strip():
        raise RequestRefused(E.BAD_REQUEST, f"field {key!r} is empty")
    return value


def _cid(p: Mapping[str, Any], key: str) -> str:
    text = _text(p, key)
    if len(text) > limits.MAX_CID_CHARS:
        raise RequestRefused(E.BAD_REQUEST, f"field {key!r} over MAX_CID_CHARS")
    try:
        return str(CID.parse(text))
    except StorageError as exc:
        raise RequestRefused(E.BAD_CID, f"field {key!r} is not a CID: {exc}") from exc


def parse_round(args: Mapping[str, Any]) -> int:
    return require_int(args, "round", 1, limits.MAX_ROUND, "MAX_ROUND")


def parse_header(args: Mapping[str, Any]) -> str | None:
    """The optional update-header CID a member sends with ``ready``."""
    return None if args.get("header") is None else _cid(args, "header")


def parse_missing(args: Mapping[str, Any]) -> list[str]:
    """The peer ids of a `collected` report: members whose update the sender could not fetch."""
    missing = args.get("missing")
    if not isinstance(missing, list) or not all(isinstance(p, str) for p in missing):
        raise RequestRefused(E.BAD_REQUEST, "field 'missing' must be a list of peer ids")
    if len(missing) > limits.MAX_MISSING_REPORT:
        raise RequestRefused(E.BAD_REQUEST, "field 'missing' over MAX_MISSING_REPORT")
    if any(len(p) > limits.MAX_TEXT_CHARS for p in missing):
        raise RequestRefused(E.BAD_REQUEST, "a peer id in 'missing' is over MAX_TEXT_CHARS")
    return missing


def parse_partition(args: Mapping[str, Any]) -> int:
    """A partition index (>= 0; the round's ``parts`` bounds it above, checked by the caller)."""
    return require_int(args, "partition", 0, limits.MAX_ROUND_MEMBERS, "MAX_ROUND_MEMBERS")


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
        raise RequestRefused(E.BAD_REQUEST, f"field 'record' is not base64: {exc}") from exc
    if len(data) > limits.MAX_SCORE_RECORD_BYTES:
        raise RequestRefused(
            E.TOO_LARGE, f"score record over MAX_SCORE_RECORD_BYTES ({len(data)} bytes)"
        )
    try:
        open_envelope(data, expected_type=SCORE_RECORD_TYPE, expected_signer=peer)
    except EnvelopeError as exc:
        raise RequestRefused(E.BAD_ENVELOPE, f"field 'record': {exc}") from exc
    return n, data


def parse_wrong(args: Mapping[str, Any]) -> list[int]:
    """`checked` {round, wrong}: the partitions a member recomputed and found wrong (sorted)."""
    wrong = args.get("wrong")
    if not isinstance(wrong, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in wrong
    ):
        raise RequestRefused(E.BAD_REQUEST, "field 'wrong' must be a list of partitions")
    if len(wrong) > limits.MAX_ROUND_MEMBERS:
        raise RequestRefused(E.BAD_REQUEST, "field 'wrong' over MAX_ROUND_MEMBERS")
    if len(set(wrong)) != len(wrong) or any(not 0 <= p <= limits.MAX_ROUND_MEMBERS for p in wrong):
        raise RequestRefused(
            E.BAD_REQUEST,
            "field 'wrong' must name distinct partitions >= 0 and <= MAX_ROUND_MEMBERS",
        )
    return sorted(wrong)


def parse_wrong_result(args: Mapping[str, Any]) -> tuple[int, int, str, str]:
    """`wrong_result` {round, partition, header, output}: evidence against a partition result;
    ``output`` is the output CID the reporter's own recomputation gives ("" for none)."""
    output = require(args, "output", str)
    output = _cid(args, "output") if output else ""
    return parse_round(args), parse_partition(args), _cid(args, "header"), output


def parse_checkpoint(args: Mapping[str, Any], peer: str) -> CheckpointRecord:
    epoch = require_int(args, "epoch", 0, limits.MAX_EPOCH, "MAX_EPOCH")
    hf_repo = require(args, "hf_repo", str, optional=True)
    hf_revision = require(args, "hf_revision", str, optional=True)
    if (hf_repo is None) != (hf_revision is None):
        raise RequestRefused(E.BAD_REQUEST, "hf_repo and hf_revision go together")
    return CheckpointRecord(
        epoch, parse_round(args), _cid(args, "manifest"), hf_repo, hf_revision, peer, 0
    )


def parse_evidence(args: Mapping[str, Any]) -> dict[str, Any]:
    """A BanRecommendation payload: {peer, round, kind, reason, update_cid|None, figures}."""
    kind = require(args, "kind", str)
    if kind not in _EVIDENCE_KINDS:
        raise RequestRefused(E.BAD_REQUEST, f"kind must be one of {_EVIDENCE_KINDS}")
    update = None if args.get("update_cid") is None else _cid(args, "update_cid")
    figures = args.get("figures", "{}")
    if isinstance(figures, Mapping):  # nested at most auth's MAX_CBOR_DEPTH: dumps cannot recurse
        figures = json.dumps(figures, sort_keys=True, default=str)
    if not isinstance(figures, str) or len(figures) > limits.MAX_FIGURES_CHARS:
        raise RequestRefused(E.BAD_REQUEST, "figures must be JSON text within MAX_FIGURES_CHARS")
    # The reputation replay parses it (text that is no JSON is refuted there, 409): bounded
    # here, so that no parse can recurse past MAX_JSON_DEPTH.
    depth = json_depth(figures)
    if depth > limits.MAX_JSON_DEPTH:
        raise RequestRefused(E.TOO_DEEP, f"field 'figures' nests {depth} deep, over MAX_JSON_DEPTH")
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
    text = require(args, "action", str)
    if text not in set(AdminVerb):
        raise RequestRefused(E.BAD_REQUEST, f"unknown admin action {text[:40]!r}")
    match AdminVerb(text):
        case AdminVerb.ALLOWLIST_ADD | AdminVerb.ALLOWLIST_REMOVE as verb:
            kind = require(args, "kind", str)
            if kind not in set(AllowKind):
                kinds = ", ".join(AllowKind)
                raise RequestRefused(E.BAD_REQUEST, f"kind must be one of {kinds}")
            value = _text(args, "value")
            if verb is AdminVerb.ALLOWLIST_ADD:
                return AllowlistAdd(AllowKind(kind), value)
            return AllowlistRemove(AllowKind(kind), value)
        case AdminVerb.BAN:
            return BanPeer(_text(args, "peer"), _text(args, "reason"))
        case AdminVerb.UNBAN:
            return UnbanPeer(_text(args, "peer"))
        case AdminVerb.LOG:
            after = require(args, "after", int, optional=True) or 0
            bounded(after, "field 'after'", 0, limits.MAX_LOG_SEQ, "MAX_LOG_SEQ")
            limit = require(args, "limit", int, optional=True) or limits.MAX_LOG_PAGE
            return LogPage(after, max(1, min(limit, limits.MAX_LOG_PAGE)))
        case AdminVerb.ALLOWLIST_LS:
            return AllowlistList()
