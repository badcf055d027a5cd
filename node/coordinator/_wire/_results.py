"""Wire form of a partitioned round's fields in the signed round record.

See specs/coordinator.md#partitioned-rounds. A full-replication round (``parts == 0``) carries
none of these keys, so its record keeps the bytes it had before partitioned rounds existed.
Decoding is bounded and typed: anything else raises :class:`BadRunState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import limits
from .._exceptions import BadRunState

__all__ = ["PartitionResultEntry", "decode_partitioned", "encode_partitioned"]


@dataclass(frozen=True)
class PartitionResultEntry:
    """The recorded result of one partition: the only header every node adopts for it."""

    peer: str  # who published it: the partition's aggregator, or a backup after its time
    header: str  # CID of the signed partition result header (the first accepted one stands)
    replaced: str | None = None  # output CID of the coordinator's recomputation, when wrong
    by: str | None = None  # the member whose evidence showed the result wrong

    def to_payload(self) -> dict[str, Any]:
        return {"peer": self.peer, "header": self.header, "replaced": self.replaced, "by": self.by}

    @classmethod
    def from_payload(cls, p: Any) -> PartitionResultEntry:
        if not isinstance(p, Mapping):
            raise BadRunState("a partition result must be a map")
        peer, header = p.get("peer"), p.get("header")
        replaced, by = p.get("replaced"), p.get("by")
        if not isinstance(peer, str) or not isinstance(header, str):
            raise BadRunState("a partition result needs peer and header strings")
        if not all(v is None or isinstance(v, str) for v in (replaced, by)):
            raise BadRunState("a partition result's replaced and by must be strings or null")
        if any(len(v) > limits.MAX_TEXT_CHARS for v in (peer, header, replaced or "", by or "")):
            raise BadRunState("a partition result field is over MAX_TEXT_CHARS")
        return cls(peer, header, replaced, by)


def encode_partitioned(
    parts: int,
    aggregators: list[str],
    results: Mapping[str, PartitionResultEntry],
    verify_deadline_ms: int | None,
    scores: Mapping[str, str] | None = None,
    scores_closed: bool = False,
    results_open_ms: int | None = None,
    backup_step_ms: int | None = None,
) -> dict[str, Any]:
    """The payload keys of a partitioned round; none for a full-replication one. ``scores`` only
    once a member sent a score record and ``scores_closed`` only once true, so a round record
    that has neither keeps the bytes it had before scores were spread; likewise the result window
    (``results_open_ms``, ``backup_step_ms``) only once it opened."""
    if parts == 0:
        return {}
    out = {
        "parts": parts,
        "aggregators": list(aggregators),
        "results": {k: results[k].to_payload() for k in sorted(results, key=int)},
        "verify_deadline_ms": verify_deadline_ms,
    }
    if scores:
        out["scores"] = dict(sorted(scores.items()))
    if scores_closed:
        out["scores_closed"] = True
    if results_open_ms is not None and backup_step_ms is not None:
        out["results_open_ms"] = results_open_ms
        out["backup_step_ms"] = backup_step_ms
    return out


def decode_partitioned(p: Mapping[str, Any]) -> dict[str, Any]:
    """RoundInfo keyword arguments from a round payload (defaults when it is not partitioned)."""
    parts = p.get("parts", 0)
    if not isinstance(parts, int) or isinstance(parts, bool):
        raise BadRunState("signed round field 'parts' must be an integer")
    if not 0 <= parts <= limits.MAX_ROUND_MEMBERS:
        raise BadRunState(f"signed round field 'parts' must be in [0, {limits.MAX_ROUND_MEMBERS}]")
    if parts == 0:
        return {}
    aggregators = p.get("aggregators")
    if (
        not isinstance(aggregators, list)
        or len(aggregators) != parts
        or not all(isinstance(a, str) for a in aggregators)
    ):
        raise BadRunState("signed round field 'aggregators' must list one peer id per partition")
    raw = p.get("results", {})
    if not isinstance(raw, Mapping) or len(raw) > parts:
        raise BadRunState("signed round field 'results' must map partitions to results")
    results: dict[str, PartitionResultEntry] = {}
    for key, entry in raw.items():
        if not isinstance(key, str) or not key.isdecimal() or str(int(key)) != key:
            raise BadRunState(f"partition result key {str(key)[:20]!r} is not a decimal index")
        if int(key) >= parts:
            raise BadRunState(f"partition result {key} is not below parts ({parts})")
        results[key] = PartitionResultEntry.from_payload(entry)
    deadline = p.get("verify_deadline_ms")
    if deadline is not None and (not isinstance(deadline, int) or isinstance(deadline, bool)):
        raise BadRunState("signed round field 'verify_deadline_ms' must be an integer or null")
    scores = p.get("scores", {})
    if (
        not isinstance(scores, Mapping)
        or len(scores) > limits.MAX_ROUND_MEMBERS
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= limits.MAX_TEXT_CHARS
            and len(v) <= limits.MAX_TEXT_CHARS
            for k, v in scores.items()
        )
    ):
        raise BadRunState("signed round field 'scores' must map members to record CIDs")
    closed = p.get("scores_closed", False)
    if not isinstance(closed, bool):
        raise BadRunState("signed round field 'scores_closed' must be a boolean")
    window = {key: p.get(key) for key in ("results_open_ms", "backup_step_ms")}
    for key, value in window.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadRunState(f"signed round field {key!r} must be an integer or absent")
    if (window["results_open_ms"] is None) != (window["backup_step_ms"] is None):
        raise BadRunState("signed round fields 'results_open_ms' and 'backup_step_ms' go together")
    if window["backup_step_ms"] is not None and window["backup_step_ms"] <= 0:
        raise BadRunState("signed round field 'backup_step_ms' must be positive")
    return {
        "parts": parts,
        "aggregators": list(aggregators),
        "results": results,
        "verify_deadline_ms": deadline,
        "scores": dict(scores),
        "scores_closed": closed,
        **window,
    }
