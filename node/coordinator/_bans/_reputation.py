"""The coordinator's own check of a reputation-ban report, from the score records it holds.

Reputations are integer functions of the agreed scores, and in partitioned rounds the agreed
scores are functions of the signed score records the coordinator closed each round with (op
``score``). The replay itself is the injected ``ServeSettings.reputation_checker`` (``cnode
coordinator serve`` gives ``cnode.node.train.check_reputation_evidence``: the code every node
runs; the coordinator package never imports the training package). This module decides, over
the rounds' facts, what is replayed or why the records cannot decide; the HTTP layer
(``_http/_evidence.py``) gathers the facts, runs the replay in a worker thread and hands the
verdict to the ban book. See specs/coordinator.md#bans.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cnode.aggregation import EvidenceKind

from .. import limits
from .._store._facts import RoundFacts
from .._wire._protocol import RoundStatus
from ._verdicts import ReputationVerdict

__all__ = [
    "RecordedRound",
    "ReputationChecker",
    "checked_kind",
    "record_input",
    "replay_bound",
    "replay_round",
]

# (round, member -> its listed update header CID, scorer -> its signed score record's bytes):
# one round of score records as the coordinator holds them (not node/train's SpreadRecords).
RecordedRound = tuple[int, Mapping[str, str], Mapping[str, bytes]]


class ReputationChecker(Protocol):
    """Replay rounds 1..``round_`` and compare the accused's figures with the records."""

    def __call__(
        self,
        rounds: Sequence[RecordedRound],
        *,
        run: str,
        accused: str,
        round_: int,
        figures: str,
    ) -> ReputationVerdict: ...


def checked_kind(evidence: Mapping[str, Any]) -> bool | None:
    """Whether the records can check this report: True for a bad-record report (one record),
    False for a reputation report (a replay of rounds 1..n), None for any other kind."""
    if evidence["kind"] == EvidenceKind.BAD_SCORE_RECORD:
        return True
    return False if evidence["kind"] == EvidenceKind.REPUTATION else None


def record_input(
    f: RoundFacts, n: int, accused: str, data: bytes | None
) -> list[RecordedRound] | str:
    """Round n's closed record of ``accused`` alone (``data``), as a bad-record report is
    checked, or why there is none."""
    if f.row is None or not f.row.parts:
        return f"round {n} was not partitioned: it has no score records"
    if data is None:
        return f"round {n} holds no score record of {accused}"
    return [(n, {}, {accused: data})]


def replay_bound(n: int) -> str | None:
    """Why rounds 1..n are too many to replay (MAX_REPUTATION_REPLAY_ROUNDS), or None."""
    bound = limits.MAX_REPUTATION_REPLAY_ROUNDS
    return f"round {n} is past MAX_REPUTATION_REPLAY_ROUNDS ({bound})" if n > bound else None


def replay_round(
    f: RoundFacts, r: int, records: Mapping[str, bytes], opened: int
) -> tuple[RecordedRound, int] | str:
    """Round ``r`` as the checker replays it, and the records opened so far (``opened`` before
    it), or why the records cannot decide: a round that is not agreed or not partitioned (a
    full round's scores are computed by each node and never reach the coordinator), or more than
    MAX_REPUTATION_REPLAY_RECORDS score records in all."""
    row = f.row
    if row is None or row.status is not RoundStatus.AGREED:
        return f"round {r} is not agreed"
    if not row.parts:
        return f"round {r} was not partitioned: its scores never reached the coordinator"
    members = set(row.members)
    kept = {p: b for p, b in records.items() if p in members}
    opened += len(kept)
    if opened > limits.MAX_REPUTATION_REPLAY_RECORDS:
        return f"rounds 1..{r} hold over MAX_REPUTATION_REPLAY_RECORDS score records"
    # Every listed member's header, whatever its status since (a banned member's stays).
    return (r, f.listed_headers(), kept), opened
