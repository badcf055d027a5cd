"""Wire messages of the coordinator API: one encode and one decode path each.

See specs/coordinator.md#messages. Requests are ``cnode/request/v1`` envelopes signed by the peer
(or admin); every state read is a ``cnode/run-state/v1`` envelope signed by the coordinator. Both
travel base64-encoded inside a JSON object ``{"envelope": "..."}``. Times are integer
milliseconds since the Unix epoch (DAG-CBOR payloads carry no floats).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .._exceptions import BadRunState
from ._ban_records import BanRecord
from ._fields import optional as _opt
from ._fields import required as _get
from ._fields import strings as _strs
from ._json import loads_bounded
from ._results import PartitionResultEntry, decode_partitioned, encode_partitioned

__all__ = [
    "EVIDENCE_HEADER",
    "PEER_ONLY_USERNAME",
    "REQUEST_TYPE",
    "STATE_TYPE",
    "CatchUpSource",
    "CheckpointHistory",
    "CheckpointRecord",
    "JoinResult",
    "Op",
    "PartitionResultEntry",
    "Phase",
    "ReportKind",
    "RoundInfo",
    "RoundStatus",
    "RunState",
    "Until",
    "ViewKind",
    "b64decode",
    "b64encode",
]

REQUEST_TYPE = "cnode/request/v1"
# The HTTP header carrying the signed `wrong_result` request (base64 envelope), whose body is
# the evidence CAR (specs/coordinator.md#evidence-of-a-wrong-result).
EVIDENCE_HEADER = "X-Cnode-Request"
STATE_TYPE = "cnode/run-state/v1"
# The username inside access tokens of peers admitted by peer id alone (tokens need one). "~" is
# not allowed in Hugging Face usernames, so it can never name a real account.
PEER_ONLY_USERNAME = "~peer"


class Phase(StrEnum):
    """The run's phase, as in Psyche."""

    WAITING_FOR_MEMBERS = "WaitingForMembers"  # fewer than min_participants in the current round
    WARMUP = "Warmup"  # enough members; joiners fetch the checkpoint before training starts
    TRAINING = "Training"  # rounds close and publish
    COOLDOWN = "Cooldown"  # an epoch ended; waiting for its checkpoint


class RoundStatus(StrEnum):
    """Where one round stands."""

    FUTURE = "future"  # not begun; peers who join while the current round is closed land here
    OPEN = "open"  # accepting join_round
    CLOSED = "closed"  # a member is ready: the list is closed, waiting for the rest or deadline
    PUBLISHED = "published"  # member list final; members exchange updates and report `collected`
    AGREED = "agreed"  # the input set is decided (``RoundInfo.agreed``): members aggregate it


class ViewKind(StrEnum):
    """Which signed read a ``cnode/run-state/v1`` payload is (its ``kind``)."""

    RUN = "run"  # RunState
    ROUND = "round"  # RoundInfo
    CHECKPOINTS = "checkpoints"  # CheckpointHistory


class ReportKind(StrEnum):
    """A node report's ``kind`` (op ``report``, specs/coordinator.md#reports)."""

    ROUND = "round"  # after a round: the held-out loss, the state it holds
    CATCH_UP = "catch_up"  # after a late join: time, bytes, bytes per holder


class CatchUpSource(StrEnum):
    """Where a catch-up report's checkpoint came from."""

    PEERS = "peers"
    HUB = "hub"


class Until(StrEnum):
    """What a long poll of a round record waits for (``GET .../rounds/{n}?until=``)."""

    PUBLISHED = "published"  # the member list is published (the default)
    AGREED = "agreed"  # the input set is decided
    RESULTS = "results"  # every partition has a recorded result (or the round is agreed)
    SCORES = "scores"  # the score records are closed (or the round is agreed)
    CHECKPOINT = "checkpoint"  # a checkpoint of the round or a later one is recorded


class Op(StrEnum):
    """Request operations; each is also the last path segment it is POSTed to."""

    JOIN = "join"
    JOIN_ROUND = "join_round"
    READY = "ready"
    LEAVE = "leave"
    CHECKPOINT = "checkpoint"
    BAN_EVIDENCE = "ban_evidence"
    COLLECTED = "collected"
    RESULT = "result"  # a partition's aggregator (or backup) records its result header
    SCORE = "score"  # a member records its signed score record (scores in partitioned rounds)
    CHECKED = "checked"  # a member recomputed its chosen partitions (specs: partitioned rounds)
    WRONG_RESULT = "wrong_result"  # evidence; POSTed to .../partitions/<p>/evidence, not here
    ADMIN = "admin"
    REPORT = "report"  # a node's measurements for the dashboard (specs/coordinator.md#reports)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: Any) -> bytes:
    """Strict base64 (RFC 4648 with padding); raise ValueError on anything else."""
    if not isinstance(text, str):
        raise ValueError("expected a base64 string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"bad base64: {exc}") from exc


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def _headers(payload: Mapping[str, Any]) -> dict[str, str]:
    value = _get(payload, "headers", dict)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRunState("signed round headers must map peer ids to CIDs")
    return dict(value)


def _texts(payload: Mapping[str, Any], key: str) -> dict[str, str]:
    value = payload.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRunState(f"signed round field {key!r} must map peer ids to strings")
    return dict(value)


def _addrs(payload: Mapping[str, Any]) -> dict[str, list[str]]:
    value = payload.get("addrs", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v)
        for k, v in value.items()
    ):
        raise BadRunState("signed round addrs must map peer ids to lists of multiaddrs")
    return {k: list(v) for k, v in value.items()}


@dataclass(frozen=True)
class CheckpointRecord:
    """A manifest CID recorded for the end of a round (round 0 = the run's initial checkpoint)."""

    epoch: int  # the epoch the round belongs to
    round: int  # the round whose aggregated result the manifest holds
    manifest: str  # manifest CID (base32 CIDv1)
    hf_repo: str | None  # optional Hugging Face repo holding the same checkpoint
    hf_revision: str | None  # its revision (commit sha or tag)
    submitter: str  # peer id that submitted it (the coordinator for round 0)
    at_ms: int  # when it was recorded

    def to_payload(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "round": self.round,
            "manifest": self.manifest,
            "hf_repo": self.hf_repo,
            "hf_revision": self.hf_revision,
            "submitter": self.submitter,
            "at_ms": self.at_ms,
        }

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> CheckpointRecord:
        return cls(
            _get(p, "epoch", int),
            _get(p, "round", int),
            _get(p, "manifest", str),
            _opt(p, "hf_repo", str),
            _opt(p, "hf_revision", str),
            _get(p, "submitter", str),
            _get(p, "at_ms", int),
        )


@dataclass(frozen=True)
class CheckpointHistory:
    """A page of the run's checkpoint records, oldest first (signed, kind "checkpoints")."""

    run: str
    after: int  # the page holds checkpoints of rounds > after
    checkpoints: list[CheckpointRecord]

    def to_payload(self) -> dict[str, Any]:
        return {
            "kind": str(ViewKind.CHECKPOINTS),
            "run": self.run,
            "after": self.after,
            "checkpoints": [c.to_payload() for c in self.checkpoints],
        }

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> CheckpointHistory:
        if p.get("kind") != ViewKind.CHECKPOINTS:
            raise BadRunState("signed record is not a checkpoint history")
        records = _get(p, "checkpoints", list)
        if not all(isinstance(r, dict) for r in records):
            raise BadRunState("checkpoint history entries must be maps")
        return cls(
            _get(p, "run", str),
            _get(p, "after", int),
            [CheckpointRecord.from_payload(r) for r in records],
        )


@dataclass(frozen=True)
class RoundInfo:
    """One round as the coordinator sees it (signed, kind "round")."""

    run: str
    round: int  # round number (rounds start at 1)
    epoch: int  # epoch of the round (for a future round: the current epoch)
    status: RoundStatus
    members: list[str]  # the published member list (sorted peer ids); empty until published
    joined: int  # members who joined and have not left (any status)
    ready: int  # of them, how many said ready
    deadline_ms: int | None  # when not-ready members are dropped (closed rounds only)
    headers: dict[str, str] = field(default_factory=dict)  # member -> update-header CID (if sent)
    # Where to dial each peer the record lists (members once published, else those who joined):
    # its last join's addresses, each ending in /p2p/PEER (specs/coordinator.md#peer-addresses).
    addrs: dict[str, list[str]] = field(default_factory=dict)
    # Published rounds: when the input set is decided without the members that have not
    # reported `collected` by then.
    collect_deadline_ms: int | None = None
    # Agreed rounds: the members whose updates every node aggregates (sorted), and why each
    # other member is left out. None before the decision.
    agreed: list[str] | None = None
    excluded: dict[str, str] = field(default_factory=dict)
    # Partitioned rounds (specs/coordinator.md#partitioned-rounds); parts == 0: full replication.
    parts: int = 0  # how many partitions the flat update is cut into
    aggregators: list[str] = field(default_factory=list)  # partition p -> who aggregates it
    # partition index (decimal string) -> its recorded result; the first accepted one stands
    results: dict[str, PartitionResultEntry] = field(default_factory=dict)
    verify_deadline_ms: int | None = None  # set once every partition has a result
    # Scores in partitioned rounds: member -> CID of its signed score record (first stands), and
    # whether no more are taken (every member sent one, or the score deadline passed).
    scores: dict[str, str] = field(default_factory=dict)
    scores_closed: bool = False
    # Partitioned rounds, once their result window opened (specs/coordinator.md#pace): when,
    # and its backup step. Backup k may submit from results_open_ms + (k + 1) x backup_step_ms.
    results_open_ms: int | None = None
    backup_step_ms: int | None = None

    def to_payload(self) -> dict[str, Any]:
        partitioned = encode_partitioned(
            self.parts,
            self.aggregators,
            self.results,
            self.verify_deadline_ms,
            self.scores,
            self.scores_closed,
            self.results_open_ms,
            self.backup_step_ms,
        )
        return {
            "kind": str(ViewKind.ROUND),
            "run": self.run,
            "round": self.round,
            "epoch": self.epoch,
            "status": str(self.status),
            "members": list(self.members),
            "joined": self.joined,
            "ready": self.ready,
            "deadline_ms": self.deadline_ms,
            "headers": dict(self.headers),
            "addrs": {peer: list(a) for peer, a in self.addrs.items()},
            "collect_deadline_ms": self.collect_deadline_ms,
            "agreed": None if self.agreed is None else list(self.agreed),
            "excluded": dict(self.excluded),
        } | partitioned

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> RoundInfo:
        if p.get("kind") != ViewKind.ROUND:
            raise BadRunState("signed state is not a round record")
        try:
            status = RoundStatus(_get(p, "status", str))
        except ValueError as exc:
            raise BadRunState(f"unknown round status {p.get('status')!r}") from exc
        return cls(
            _get(p, "run", str),
            _get(p, "round", int),
            _get(p, "epoch", int),
            status,
            _strs(p, "members"),
            _get(p, "joined", int),
            _get(p, "ready", int),
            _opt(p, "deadline_ms", int),
            _headers(p),
            _addrs(p),
            _opt(p, "collect_deadline_ms", int),
            None if p.get("agreed") is None else _strs(p, "agreed"),
            _texts(p, "excluded"),
            **decode_partitioned(p),
        )

    @property
    def listed(self) -> bool:
        """The member list is final (published, and perhaps agreed)."""
        return self.status in (RoundStatus.PUBLISHED, RoundStatus.AGREED)


@dataclass(frozen=True)
class RunState:
    """The whole public state of a run (signed, kind "run"). ``version`` grows with every change."""

    run: str  # run id
    coordinator: str  # the coordinator's peer id (the signer)
    version: int  # sequence number of the last change-log entry; larger = newer
    at_ms: int  # when this state was signed
    config: dict[str, Any]  # the run config (RunConfig.to_dict())
    phase: Phase
    phase_until_ms: int | None  # end of Warmup/Cooldown
    epoch: int
    round: RoundInfo  # the current round (open or closed)
    last_round: RoundInfo | None  # the latest published round
    waiting: str | None  # why the run is waiting, in words ("round 3 has 1 of 2 participants")
    checkpoint: CheckpointRecord | None  # the current (latest) checkpoint
    bans: list[BanRecord] = field(default_factory=list)
    p2p_addrs: list[str] = field(default_factory=list)  # coordinator's libp2p addrs (state gossip)

    def to_payload(self) -> dict[str, Any]:
        return {
            "kind": str(ViewKind.RUN),
            "run": self.run,
            "coordinator": self.coordinator,
            "version": self.version,
            "at_ms": self.at_ms,
            "config": json.dumps(self.config, sort_keys=True),  # JSON text: floats stay exact
            "phase": str(self.phase),
            "phase_until_ms": self.phase_until_ms,
            "epoch": self.epoch,
            "round": self.round.to_payload(),
            "last_round": None if self.last_round is None else self.last_round.to_payload(),
            "waiting": self.waiting,
            "checkpoint": None if self.checkpoint is None else self.checkpoint.to_payload(),
            "bans": [b.to_payload() for b in self.bans],
            "p2p_addrs": list(self.p2p_addrs),
        }

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> RunState:
        if p.get("kind") != ViewKind.RUN:
            raise BadRunState("signed state is not a run record")
        try:
            phase = Phase(_get(p, "phase", str))
            config = loads_bounded(_get(p, "config", str))
        except ValueError as exc:
            raise BadRunState(f"bad phase or config in signed state: {exc}") from exc
        if not isinstance(config, dict):
            raise BadRunState("signed state config is not an object")
        last = _opt(p, "last_round", dict)
        ckpt = _opt(p, "checkpoint", dict)
        bans = _get(p, "bans", list)
        if not all(isinstance(b, dict) for b in bans):
            raise BadRunState("signed state bans must be records")
        return cls(
            run=_get(p, "run", str),
            coordinator=_get(p, "coordinator", str),
            version=_get(p, "version", int),
            at_ms=_get(p, "at_ms", int),
            config=config,
            phase=phase,
            phase_until_ms=_opt(p, "phase_until_ms", int),
            epoch=_get(p, "epoch", int),
            round=RoundInfo.from_payload(_get(p, "round", dict)),
            last_round=None if last is None else RoundInfo.from_payload(last),
            waiting=_opt(p, "waiting", str),
            checkpoint=None if ckpt is None else CheckpointRecord.from_payload(ckpt),
            bans=[BanRecord.from_payload(b) for b in bans],
            p2p_addrs=_strs(p, "p2p_addrs"),
        )

    def banned(self, peer: str) -> BanRecord | None:
        """The ban of ``peer``, or None; peers refuse updates and blocks from banned peers."""
        return next((b for b in self.bans if b.peer == peer), None)


@dataclass(frozen=True)
class JoinResult:
    """The answer to a join: a short-lived access token signed by the coordinator."""

    token: bytes  # cnode/access-token/v1 envelope; show it to peers and send it in requests
    peer: str  # the peer id it was issued to
    username: str  # the HF username checked ("" for a peer-id-only join)
    expires_at_ms: int  # when it stops being accepted
    # Addresses dialed back (specs/coordinator.md#reachability); none: outbound-only.
    reachable: list[str] = field(default_factory=list)

    @property
    def reachability(self) -> str:
        """``public`` (some address was dialed back) or ``outbound-only``."""
        return "public" if self.reachable else "outbound-only"

    def to_json(self) -> dict[str, Any]:
        return {
            "token": b64encode(self.token),
            "peer": self.peer,
            "username": self.username,
            "expires_at_ms": self.expires_at_ms,
            "reachable": list(self.reachable),
            "reachability": self.reachability,
        }

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> JoinResult:
        return cls(
            b64decode(j.get("token")),
            _get(j, "peer", str),
            _get(j, "username", str),
            _get(j, "expires_at_ms", int),
            _strs(j, "reachable") if "reachable" in j else [],
        )


def ms(t: float | None) -> int | None:
    """Seconds (float) to integer milliseconds, as every payload carries times."""
    return _ms(t)
