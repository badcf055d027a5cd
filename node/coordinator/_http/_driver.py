"""Where the rules meet the store: read the facts, ask the rules, apply what they decide.

Every state-changing request runs in one ``Store.tx()`` opened by its handler; inside it, each
method here reads the rows the rules need (``Store.facts``), calls the pure rules
(``RunMachine``, ``PartitionRules``, ``BanBook``), applies the writes they return
(``Store.apply``) and, after any change that may finish or reopen a round, advances the run: asks
``RunMachine.step`` for the next due transition until the run settles. A refusal raises
``RequestRefused`` from the rules before anything is written, and the transaction rolls back.
See specs/coordinator.md#rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from .._bans._bans import BanBook
from .._bans._verdicts import ReputationVerdict
from .._config import RunConfig
from .._rounds._machine import RunMachine
from .._rounds._partitions import PartitionRules
from .._rounds._views import SignedViews
from .._store._rows import ResultRow
from .._store._store import Store
from .._store._writes import Log, PutBan, Write
from .._wire._admin import (
    AdminAction,
    AllowlistAdd,
    AllowlistList,
    AllowlistRemove,
    BanPeer,
    LogPage,
    UnbanPeer,
)
from .._wire._ban_records import BanKind, BanReport
from .._wire._protocol import CheckpointHistory, CheckpointRecord, RoundInfo, RunState

__all__ = ["RunDriver"]

log = structlog.get_logger(__name__)

# advance() applies at most this many transitions per call (each changes the state; a run that
# has not settled after them is logged, and the next change or tick goes on).
_MAX_STEPS = 64


class RunDriver:
    """One run's rules over its store. Every method runs inside the caller's ``Store.tx()``."""

    def __init__(self, store: Store, config: RunConfig, coordinator: str) -> None:
        self.store = store
        self.config = config
        self.machine = RunMachine(config, coordinator)
        self.views = SignedViews(config, coordinator, self.machine.partitions)

    @property
    def partitions(self) -> PartitionRules:
        return self.machine.partitions

    @property
    def bans(self) -> BanBook:
        return self.machine.bans

    # -- writing and advancing ---------------------------------------------------------------------

    def write(self, writes: Sequence[Write]) -> None:
        """Apply the rules' writes; echo the transitions and bans to the process log."""
        self.store.apply(writes)
        for w in writes:
            if isinstance(w, Log) and w.echo:
                log.info(w.kind, **w.detail)

    def _changed(self, writes: Sequence[Write], now: float) -> None:
        """Apply ``writes`` and, when there were any, advance the run."""
        if writes:
            self.write(writes)
            self.advance(now)

    def advance(self, now: float) -> None:
        """Apply every due transition; each one is logged. Bounded: each step changes state."""
        for _ in range(_MAX_STEPS):
            step = self.machine.step(self.store.facts(), now)
            self.write(step.writes)
            if step.settled:
                return
        log.warning("advance_not_settled")

    def next_due(self) -> float | None:
        return self.machine.next_due(self.store.facts())

    # -- who may ask -------------------------------------------------------------------------------

    def check_not_banned(self, peer: str, username: str = "") -> None:
        ban = self.store.ban_row(peer) or self.store.user_ban(username)
        self.machine.check_not_banned(peer, username, ban)

    def check_may_join(self, peer: str, username: str, orgs: list[str]) -> None:
        entries = self.machine.may_join_entries(peer, username, orgs)
        listed = [e for e in entries if self.store.allowed(*e)]
        ban = self.store.ban_row(peer) or self.store.user_ban(username)
        self.machine.check_may_join(peer, username, ban, listed)

    def consume_counter(self, peer: str, counter: int) -> None:
        self.write(self.machine.consume_counter(peer, counter, self.store.last_counter(peer)))

    def record_join(
        self, peer: str, username: str, now: float, expires: float, addrs: list[str]
    ) -> None:
        self.write(self.machine.record_join(peer, username, now, expires, addrs))

    # -- rounds ------------------------------------------------------------------------------------

    def join_round(self, peer: str, username: str, now: float) -> int:
        n, writes = self.machine.join_round(self.store.facts(), peer, username, now)
        self._changed(writes, now)
        return n

    def ready(self, peer: str, n: int, now: float, header: str | None = None) -> None:
        self._changed(self.machine.ready(self.store.facts(n), peer, n, now, header), now)

    def collected(self, peer: str, n: int, missing: list[str], now: float) -> None:
        self._changed(self.machine.collected(self.store.facts(n), peer, n, missing, now), now)

    def leave(self, peer: str, n: int, now: float) -> None:
        self._changed(self.machine.leave(self.store.facts(n), peer, n, now), now)

    def result(self, peer: str, n: int, partition: int, header: str, now: float) -> None:
        f = self.store.round_facts(n)
        self._changed(self.partitions.result(f, peer, n, partition, header, now), now)

    def score(self, peer: str, n: int, data: bytes, now: float) -> str:
        record, writes = self.partitions.score(self.store.round_facts(n), peer, n, data, now)
        self.write(writes)
        return record

    def checked(self, peer: str, n: int, wrong: list[int], now: float) -> None:
        f = self.store.round_facts(n)
        self._changed(self.partitions.checked(f, peer, n, wrong, now), now)

    def submit_checkpoint(
        self, peer: str, record: CheckpointRecord, now: float
    ) -> CheckpointRecord:
        f = self.store.facts(record.round)
        stored, writes = self.machine.submit_checkpoint(f, peer, record, now)
        self._changed(writes, now)
        return stored

    # -- bans and evidence -------------------------------------------------------------------------

    def ban_report(
        self,
        reporter: str,
        evidence: dict[str, Any],
        now: float,
        verdict: ReputationVerdict | None = None,
    ) -> BanReport:
        """Count a member's ban evidence; ban on a majority or a confirmed report."""
        f = self.store.facts(int(evidence["round"]))
        earlier = self.store.reporters(self.bans.same_evidence(evidence))
        username = self.store.peer_username(str(evidence["peer"]))
        report, writes = self.bans.report(
            f, reporter, evidence, now, earlier=earlier, username=username, verdict=verdict
        )
        self.write(writes)
        if any(isinstance(w, PutBan) for w in writes):
            self.advance(now)  # a ban may finish or reopen a round
        return report

    def parties(self, reporter: str, evidence: dict[str, Any]) -> list[str]:
        f = self.store.round_facts(int(evidence["round"]))
        return self.bans.parties(f, reporter, evidence)

    def evidence_target(self, peer: str, n: int, partition: int, header: str) -> ResultRow:
        f = self.store.round_facts(n)
        return self.partitions.evidence_target(f, peer, n, partition, header)

    def wrong_result(
        self,
        reporter: str,
        n: int,
        partition: int,
        *,
        signer: str,
        claimed: str,
        recomputed: str,
        reported: str,
        now: float,
    ) -> None:
        writes = self.partitions.wrong_result(
            self.store.facts(n),
            reporter,
            n,
            partition,
            signer=signer,
            signer_username=self.store.peer_username(signer),
            claimed=claimed,
            recomputed=recomputed,
            reported=reported,
            now=now,
        )
        self.write(writes)
        self.advance(now)

    # -- administration ----------------------------------------------------------------------------

    def admin(self, action: AdminAction, signer: str, now: float) -> dict[str, Any]:
        """Apply one admin action (the caller checked ``signer`` is an admin)."""
        s, m = self.store, self.machine
        match action:
            case AllowlistAdd(kind, value):
                changed, writes = m.allowlist_add(
                    kind,
                    value,
                    signer,
                    now,
                    size=s.allowlist_size(),
                    present=s.allowed(kind, value),
                )
                self.write(writes)
                return {"changed": changed}
            case AllowlistRemove(kind, value):
                present = s.allowed(kind, value)
                changed, writes = m.allowlist_remove(kind, value, signer, now, present=present)
                self.write(writes)
                return {"changed": changed}
            case AllowlistList():
                return {"allowlist": s.allowlist()}
            case BanPeer(peer, reason):
                username = s.peer_username(peer)
                self.write(
                    self.bans.ban(s.facts(), peer, username, BanKind.ADMIN, reason, signer, now)
                )
                self.advance(now)
                return {}
            case UnbanPeer(peer):
                banned = s.ban_row(peer) is not None
                self.write(self.bans.unban(peer, banned, f"admin:{signer}", now))
                return {}
            case LogPage(after, limit):
                return {"log": [entry.to_json() for entry in s.log_page(after, limit)]}
        raise AssertionError(f"unhandled admin action {action!r}")

    # -- signed views ------------------------------------------------------------------------------

    def round_info(self, n: int, now: float) -> RoundInfo:
        f = self.store.round_facts(n)
        addrs = self.store.peer_addrs(sorted(f.members))
        return self.views.round_info(f, n, self.store.run_row().epoch, addrs, now)

    def run_state(self, now: float) -> RunState:
        s = self.store
        f = s.facts(s.run_row().round - 1)
        n = f.run.round
        peers = sorted({*f.round(n).members, *(f.round(n - 1).members if n > 1 else ())})
        return self.views.run_state(f, s.version(), s.ban_rows(), s.peer_addrs(peers), now)

    def checkpoint_history(self, after: int, limit: int) -> CheckpointHistory:
        return self.views.checkpoint_history(after, self.store.checkpoint_rows(after, limit))

    def scores_closed(self, n: int, now: float) -> bool:
        """Round ``n``'s score records are closed (False for a round that is not listed)."""
        return self.partitions.scores_closed(self.store.round_facts(n), now)
