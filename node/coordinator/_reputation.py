"""The coordinator's own check of a reputation-ban report, from the score records it holds.

Reputations are integer functions of the agreed scores, and in partitioned rounds the agreed
scores are functions of the signed score records the coordinator closed each round with (op
``score``). The replay itself is the injected ``ServeSettings.reputation_checker`` (``cnode
coordinator serve`` gives ``cnode.node.train.check_reputation_evidence``: the code every node
runs; the coordinator package never imports the training package). This module gathers what it
replays and says why a report cannot be checked here. See specs/coordinator.md#bans.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Protocol

from . import limits
from ._protocol import RoundStatus
from ._store import Store

__all__ = ["REPUTATION_REASON", "ReputationChecker", "ReputationVerdict", "replay_input"]

# How a node's ReputationPolicy words a reputation ban (aggregation/_scores.py).
REPUTATION_REASON = "reputation below the ban bound in "

# (round, member -> its listed update header CID, scorer -> its signed score record's bytes)
ScoredRound = tuple[int, Mapping[str, str], Mapping[str, bytes]]


class ReputationVerdict(Protocol):
    """What the replay found (``cnode.node.train.ReputationVerdict``)."""

    @property
    def decided(self) -> bool: ...  # False: the records alone cannot decide
    @property
    def correct(self) -> bool: ...  # decided, and the figures are what the records give
    @property
    def reason(self) -> str: ...  # what did not match, or why undecided


class ReputationChecker(Protocol):
    """Replay rounds 1..``round_`` and compare the accused's figures with the records."""

    def __call__(
        self, rounds: Sequence[ScoredRound], *, run: str, accused: str, round_: int, figures: str
    ) -> ReputationVerdict: ...


def replay_input(store: Store, n: int) -> list[ScoredRound] | str:
    """Every round 1..n as the checker replays it, or why the records cannot decide: a round
    that is not agreed or not partitioned (a full round's scores are computed by each node and
    never reach the coordinator), or more than MAX_REPUTATION_REPLAY_ROUNDS rounds."""
    bound = limits.MAX_REPUTATION_REPLAY_ROUNDS
    if n > bound:
        return f"round {n} is past MAX_REPUTATION_REPLAY_ROUNDS ({bound})"
    out: list[ScoredRound] = []
    for r in range(1, n + 1):
        row = store.round_row(r)
        if row is None or row["status"] != RoundStatus.AGREED:
            return f"round {r} is not agreed"
        if not int(row["parts"] or 0):
            return f"round {r} was not partitioned: its scores never reached the coordinator"
        members = json.loads(row["members"] or "[]")
        # Every listed member's header, whatever its status since (a banned member's stays).
        headers = {
            str(m["peer"]): str(m["header"])
            for m in store.db.execute(
                "SELECT peer, header FROM members WHERE round = ? AND header IS NOT NULL "
                "ORDER BY peer",
                (r,),
            ).fetchall()
            if m["peer"] in members
        }
        records = {p: b for p, b in store.score_bytes(r).items() if p in members}
        out.append((r, headers, records))
    return out
