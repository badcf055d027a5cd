"""The coordinator's own check of a reputation-ban report, from the score records it holds.

Reputations are integer functions of the agreed scores, and in partitioned rounds the agreed
scores are functions of the signed score records the coordinator closed each round with (op
``score``). The replay itself is the injected ``ServeSettings.reputation_checker`` (``cnode
coordinator serve`` gives ``cnode.node.train.check_reputation_evidence``: the code every node
runs; the coordinator package never imports the training package). This module gathers what it
replays (on the event loop, in one transaction), runs the replay in a worker thread (at most
MAX_EVIDENCE_CHECKS at once, with partition evidence) and hands the verdict to the ban book, or
says why a report cannot be checked here. See specs/coordinator.md#bans.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import structlog

from cnode.aggregation import EvidenceKind

from .. import limits
from .._store._store import Store
from .._wire._protocol import RoundStatus
from ._slots import EvidenceSlots
from ._verdicts import ReputationVerdict


class _Bans(Protocol):
    def parties(self, reporter: str, evidence: dict[str, Any]) -> list[str]: ...


class _Machine(Protocol):
    """What the check uses of the run machine (``_machine.RunMachine``: not imported, as the
    ban book imports this module)."""

    @property
    def bans(self) -> _Bans: ...

    def check_not_banned(self, peer: str, username: str = "") -> None: ...


class _Server(Protocol):
    """What the check uses of ``_server.CoordinatorServer`` (not imported: it imports this
    module, and an import cycle, even for types only, is refused by tests/test_layering.py)."""

    run: str
    store: Store

    @property
    def machine(self) -> _Machine: ...

    evidence_slots: EvidenceSlots
    reputation_checker: ReputationChecker | None

    def access(self, peer: str, token: Any, now: float) -> str: ...


__all__ = [
    "ReputationChecker",
    "record_input",
    "replay_input",
    "reputation_verdict",
]

log = structlog.get_logger(__name__)

# (round, member -> its listed update header CID, scorer -> its signed score record's bytes)
ScoredRound = tuple[int, Mapping[str, str], Mapping[str, bytes]]


class ReputationChecker(Protocol):
    """Replay rounds 1..``round_`` and compare the accused's figures with the records."""

    def __call__(
        self, rounds: Sequence[ScoredRound], *, run: str, accused: str, round_: int, figures: str
    ) -> ReputationVerdict: ...


def record_input(store: Store, n: int, accused: str) -> list[ScoredRound] | str:
    """Round n's closed record of ``accused`` alone, as a bad-record report is checked."""
    row = store.round_row(n)
    if row is None or not row.parts:
        return f"round {n} was not partitioned: it has no score records"
    data = store.score_bytes(n).get(accused)
    if data is None:
        return f"round {n} holds no score record of {accused}"
    return [(n, {}, {accused: data})]


def replay_input(store: Store, n: int) -> list[ScoredRound] | str:
    """Every round 1..n as the checker replays it, or why the records cannot decide: a round
    that is not agreed or not partitioned (a full round's scores are computed by each node and
    never reach the coordinator), more than MAX_REPUTATION_REPLAY_ROUNDS rounds or
    MAX_REPUTATION_REPLAY_RECORDS score records."""
    bound = limits.MAX_REPUTATION_REPLAY_ROUNDS
    if n > bound:
        return f"round {n} is past MAX_REPUTATION_REPLAY_ROUNDS ({bound})"
    out: list[ScoredRound] = []
    opened = 0
    for r in range(1, n + 1):
        row = store.round_row(r)
        if row is None or row.status is not RoundStatus.AGREED:
            return f"round {r} is not agreed"
        if not row.parts:
            return f"round {r} was not partitioned: its scores never reached the coordinator"
        members = row.members
        # Every listed member's header, whatever its status since (a banned member's stays).
        headers = store.listed_headers(r, members)
        records = {p: b for p, b in store.score_bytes(r).items() if p in members}
        opened += len(records)
        if opened > limits.MAX_REPUTATION_REPLAY_RECORDS:
            return f"rounds 1..{r} hold over MAX_REPUTATION_REPLAY_RECORDS score records"
        out.append((r, headers, records))
    return out


async def reputation_verdict(
    server: _Server, peer: str, token: Any, evidence: dict[str, Any]
) -> ReputationVerdict | None:
    """The replay's verdict on a reputation report, or None (not one, no checker, the accused
    banned already, or the records cannot decide). Who reports whom is checked first, so a
    stranger never costs a replay; the ban book re-checks everything in its transaction."""
    checker = server.reputation_checker
    record = evidence["kind"] == EvidenceKind.BAD_SCORE_RECORD
    if checker is None or not (record or evidence["kind"] == EvidenceKind.REPUTATION):
        return None
    n, accused = int(evidence["round"]), str(evidence["peer"])
    username = server.access(peer, token, time.time())
    with server.store.tx():
        server.machine.check_not_banned(peer, username)
        server.machine.bans.parties(peer, evidence)
        if server.store.ban_row(accused) is not None:
            return None
    # The slot first, the records then: what waits for a slot holds no records (at most
    # MAX_EVIDENCE_CHECKS replays' records in memory at once).
    async with server.evidence_slots.hold(peer):
        with server.store.tx():
            rounds = (
                record_input(server.store, n, accused) if record else replay_input(server.store, n)
            )
        if isinstance(rounds, str):
            log.info("reputation_unchecked", peer=accused, round=n, why=rounds)
            return None
        verdict = await asyncio.to_thread(
            checker, rounds, run=server.run, accused=accused, round_=n, figures=evidence["figures"]
        )
    if not verdict.decided:
        log.info("reputation_unchecked", peer=accused, round=n, why=verdict.reason)
    return verdict
