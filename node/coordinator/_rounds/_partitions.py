"""The coordinator's rules for partitioned rounds (specs/coordinator.md#partitioned-rounds).

A partitioned round is published with ``parts`` > 0: member ``aggregators[p]`` aggregates
partition ``p`` of everyone's update and records its signed partition result header here (op
`result`); the first accepted header of a partition stands, so no aggregator can show different
results to different nodes. Backups take a silent partition over one after another, a step
apart, once the aggregator had the first step of the result window (its start and step follow
the round's measured pace: ``_pace.py``). Once every partition has a result, members recompute
the partitions chosen for them and report `checked`; a wrong result is self-proving evidence,
which the coordinator recomputes itself (``_evidence.py``) and bans its signer at once.

Runs inside the caller's ``Store.tx()`` like :class:`RunMachine`, which calls it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cnode.aggregation import assign_partitions, backup_aggregators, partition_count
from cnode.aggregation import limits as aggregation_limits
from cnode.storage import DAG_CBOR, compute_cid

from .. import limits
from .._bans._bans import BanBook
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import RequestRefused
from .._pace import median_time, phase_closes_at
from .._store._rows import ResultRow, RoundRow
from .._store._store import Store
from .._wire._ban_records import BanKind
from .._wire._protocol import PartitionResultEntry, RoundStatus, ms

__all__ = ["PartitionRules"]


class PartitionRules:
    """Partitioned rounds of one run over its :class:`Store`.

    ``advance`` and ``log`` are the run machine's: an accepted result or report may finish the
    round, and every transition is logged the same way.
    """

    def __init__(
        self,
        store: Store,
        config: RunConfig,
        bans: BanBook,
        advance: Callable[[float], None],
        log: Callable[..., None],
    ) -> None:
        self.store = store
        self.config = config
        self.bans = bans
        self.advance = advance
        self.log = log

    # -- publishing -----------------------------------------------------------------------------

    def parts_for(self, members: int) -> int:
        """0 (full replication) or the partition count of a round of ``members`` members."""
        if members < 1 or not self.config.partition_rounds(members):
            return 0
        return partition_count(members, aggregation_limits.SEGMENTS)

    def aggregators(self, n: int, members: list[str], parts: int) -> list[str]:
        return assign_partitions(self.config.run, n, members, parts) if parts else []

    def info(self, n: int, row: RoundRow) -> dict[str, Any]:
        """The RoundInfo keyword arguments of a listed round's partitioned fields."""
        parts = row.parts
        if parts == 0:
            return {}
        members = row.members
        results = {
            str(p): PartitionResultEntry(r.peer, r.header, r.replaced, r.by)
            for p, r in self.store.results(n).items()
        }
        scores = self.store.score_records(n)
        return {
            "parts": parts,
            "aggregators": self.aggregators(n, members, parts),
            "results": results,
            "verify_deadline_ms": ms(row.verify_deadline),
            "scores": scores,
            "scores_closed": self._scores_closed(row, time.time()),
            "results_open_ms": ms(row.results_open),
            "backup_step_ms": ms(row.backup_step),
        }

    def scores_closed(self, n: int, now: float) -> bool:
        """Round ``n``'s score records are closed (False for a round that is not listed)."""
        row = self.store.round_row(n)
        return row is not None and self._scores_closed(row, now)

    def _scores_closed(self, row: RoundRow, now: float) -> bool:
        """No score record is taken any more: the round is agreed, or its score phase closed
        (specs/coordinator.md#scores-in-partitioned-rounds). The verdict only moves from open
        to closed: ``now`` grows, and records are only added while open."""
        if row.status is RoundStatus.AGREED:
            return True
        at = self._scores_close_at(row)
        return at is not None and now >= at

    def _scores_close_at(self, row: RoundRow) -> float | None:
        """When a published partitioned round's score records close: once every member sent
        one, else by the pace rule (_pace.py) from the nominal score deadline,
        SCORE_CLOSE_MARGIN_S before the collect deadline (or a quarter of the collect window
        before it, when that is shorter): the moment aggregators stop fetching. A loaded
        machine or slow link delays the scores (and the ban they may carry), it does not
        change them."""
        end, start = row.collect_deadline, row.published_at
        if end is None or start is None:
            return None
        window = end - start
        nominal = end - min(limits.SCORE_CLOSE_MARGIN_S, window / 4)
        members = row.members
        times = self.store.report_times(row.round, "scored_at", members)
        late = min(self.config.rounds.late_max_s, limits.SCORE_CLOSE_MAX_S)
        return phase_closes_at(start, nominal, times, len(members), late)

    def _results_open_at(self, row: RoundRow) -> float:
        """When round ``row``'s result window opens: at the collect deadline, or when the score
        records close if that is later (every aggregator waits for them)."""
        opens = _set(row.collect_deadline)
        closes = self._scores_close_at(row) if self.config.scored else None
        if closes is not None:
            opens = max(opens, closes)
        return opens

    def _backup_step(self, row: RoundRow) -> float:
        """The round's backup step: rounds.backup_step_s, or the median member's time to score
        when longer (publish -> score record: fetching and scoring two updates; a partition is
        about one update to fetch and aggregate), at most BACKUP_STEP_MAX_S."""
        step = self.config.rounds.backup_step_s
        if self.config.scored:
            members = row.members
            times = self.store.report_times(row.round, "scored_at", members)
            median = median_time(_set(row.published_at), times, len(members))
            if median is not None:
                step = max(step, min(median, limits.BACKUP_STEP_MAX_S))
        return step

    # -- ops ------------------------------------------------------------------------------------

    def _listed(self, peer: str, n: int) -> tuple[RoundRow, list[str], int]:
        row = self.store.round_row(n)
        if row is None or not row.listed:
            raise RequestRefused(E.ROUND_NOT_PUBLISHED, f"round {n} has no published list")
        parts = row.parts
        if parts == 0:
            raise RequestRefused(
                E.NOT_PARTITIONED, f"round {n} is not partitioned (full replication)"
            )
        members = row.members
        if peer not in members:
            raise RequestRefused(E.NOT_MEMBER, f"peer {peer} is not a member of round {n}")
        return row, members, parts

    def result(self, peer: str, n: int, partition: int, header: str, now: float) -> None:
        """Record ``peer``'s result header of ``partition``, if it may submit it now."""
        row, members, parts = self._listed(peer, n)
        if partition >= parts:
            raise RequestRefused(
                E.BAD_REQUEST, f"partition {partition} is not below parts ({parts})"
            )
        recorded = self.store.results(n).get(partition)
        if recorded is not None:
            if recorded.peer == peer and recorded.header == header:
                return  # the same result again (a resend): already recorded
            raise RequestRefused(
                E.RESULT_RECORDED,
                f"partition {partition} of round {n} already has a result: {recorded.header}"
                f" from {recorded.peer}",
            )
        if row.status is RoundStatus.AGREED:
            raise RequestRefused(E.ROUND_OVER, f"round {n} is agreed; results are closed")
        aggregator = self.aggregators(n, members, parts)[partition]
        if peer != aggregator:
            self._check_backup(peer, n, members, partition, aggregator, row, now)
        self.store.put_result(n, partition, peer, header, now)
        detail: dict[str, Any] = {"round": n, "partition": partition, "header": header}
        if peer != aggregator:
            excluded = dict(row.excluded)
            excluded[aggregator] = (
                f"partition {partition}: no result by the deadline; aggregated by backup {peer}"
            )
            self.store.set_round(n, excluded=excluded)
            detail["backup_for"] = aggregator
        self.store.append_log(now, peer, "result", detail)
        self.advance(now)

    def _check_backup(
        self,
        peer: str,
        n: int,
        members: list[str],
        partition: int,
        aggregator: str,
        row: RoundRow,
        now: float,
    ) -> None:
        backups = backup_aggregators(self.config.run, n, members, partition)
        backups = backups[: limits.MAX_PARTITION_BACKUPS]
        if row.results_open is None or row.backup_step is None:
            raise RequestRefused(
                E.NOT_YOUR_PARTITION,
                f"partition {partition} of round {n} is aggregated by {aggregator}; its backups "
                f"({', '.join(backups) or 'none'}) may submit it one step after the result "
                "window opens (the collect deadline, or the score records' close), not before",
            )
        start, step = row.results_open, row.backup_step
        if peer in backups and now >= start + (backups.index(peer) + 1) * step:
            return
        who = ", ".join(
            f"{b} from {ms(start + (k + 1) * step)} ms since the epoch"
            for k, b in enumerate(backups)
        )
        raise RequestRefused(
            E.NOT_YOUR_PARTITION,
            f"partition {partition} of round {n} is aggregated by {aggregator}; "
            f"after its step of the result window its backups may submit it: {who or 'none'}",
        )

    def score(self, peer: str, n: int, data: bytes, now: float) -> str:
        """Record ``peer``'s signed score record for round ``n`` and return its CID: one per
        member, the first stands, none once the round's score records are closed
        (specs/coordinator.md#scores-in-partitioned-rounds). Its signature was checked; its
        payload is the nodes' to judge (they ignore what a record may not say)."""
        record = str(compute_cid(data, DAG_CBOR))
        row, _members, _parts = self._listed(peer, n)
        scores = self.store.score_records(n)
        if peer in scores:
            if scores[peer] == record:
                return record  # the same record again (a resend): already recorded
            raise RequestRefused(
                E.SCORE_RECORDED, f"round {n} already has {peer}'s score record {scores[peer]}"
            )
        if self._scores_closed(row, now):
            raise RequestRefused(
                E.SCORES_CLOSED, f"round {n}'s score records are closed (deadline passed)"
            )
        self.store.set_member(n, peer, score_record=record, scored_at=now, score_bytes=data)
        self.store.append_log(now, peer, "score", {"round": n, "record": record})
        return record

    def checked(self, peer: str, n: int, wrong: list[int], now: float) -> None:
        """A member recomputed its chosen partitions; ``wrong`` are those it found wrong."""
        row, _members, parts = self._listed(peer, n)
        if row.status is RoundStatus.AGREED:
            return  # decided already (a late or repeated report): the decision stands
        bad = [p for p in wrong if p >= parts]
        if bad:
            raise RequestRefused(
                E.BAD_REQUEST, f"field 'wrong' names partition {bad[0]}, not below {parts}"
            )
        missing = sorted(set(range(parts)) - set(self.store.results(n)))
        if missing:
            raise RequestRefused(
                E.RESULTS_PENDING,
                f"round {n}: partition(s) {missing[:8]} have no result yet; check after all do",
            )
        self.store.set_member(n, peer, checked=list(wrong), checked_at=now)
        self.store.append_log(now, peer, "checked", {"round": n, "wrong": wrong})
        self.advance(now)

    # -- transitions ------------------------------------------------------------------------------

    def due(self, row: RoundRow) -> list[float]:
        """When a published partitioned round next has something to do without a request."""
        if row.verify_deadline is not None:
            return [self._verify_closes_at(row)]
        if row.results_open is None:
            return [self._results_open_at(row)]
        steps = min(row.backup_steps, limits.MAX_PARTITION_BACKUPS) + 1
        return [row.results_open + steps * _set(row.backup_step)]

    def _verify_closes_at(self, row: RoundRow) -> float:
        """When the round is agreed without the members that have not reported `checked`: by
        the pace rule from the verify deadline (the phase started when every result was in)."""
        n, deadline = row.round, _set(row.verify_deadline)
        members = row.members
        voters = [p for p in members if self.store.ban_row(p) is None]
        times = self.store.report_times(n, "checked_at", voters)
        start = deadline - self.config.rounds.verify_timeout_s
        late = self.config.rounds.late_max_s
        return phase_closes_at(start, deadline, times, len(voters), late)

    def step(self, row: RoundRow, now: float) -> bool:
        """Apply one due transition of published partitioned round ``row``; False when none."""
        s, r = self.store, self.config.rounds
        n, parts = row.round, row.parts
        results = s.results(n)
        if len(results) == parts:
            if row.verify_deadline is None:
                s.set_round(n, verify_deadline=now + r.verify_timeout_s)
                self.log(now, "results_complete", round=n, parts=parts)
                return True
            members = row.members
            silent = sorted(p for p in set(members) - set(s.checked(n)) if s.ban_row(p) is None)
            if not silent or now >= self._verify_closes_at(row):
                self._agree(row, results, now, silent=silent)
                return True
            return False
        if row.results_open is None:
            if now < self._results_open_at(row):
                return False
            step = self._backup_step(row)
            s.set_round(n, results_open=now, backup_step=step)
            self.log(now, "results_window", round=n, step=step)
            return True
        steps = row.backup_steps
        start, step = row.results_open, _set(row.backup_step)
        if now < start + (steps + 1) * step:
            return False
        if steps < limits.MAX_PARTITION_BACKUPS:
            s.set_round(n, backup_steps=steps + 1)
            members = row.members
            missing = sorted(set(range(parts)) - set(results))
            backups = {}
            for p in missing:
                order = backup_aggregators(self.config.run, n, members, p)
                backups[p] = order[steps] if steps < len(order) else None
            self.log(now, "partition_backups_due", round=n, step=steps, backups=backups)
            return True
        self._agree(row, results, now, silent=[])
        return True

    def _agree(
        self, row: RoundRow, results: dict[int, ResultRow], now: float, *, silent: list[str]
    ) -> None:
        """Agree partitioned round ``row``: every member listed, ``excluded`` says who did not
        deliver a partition and who is banned; partitions without a result keep the parent."""
        s, n, parts = self.store, row.round, row.parts
        members = row.members
        aggregators = self.aggregators(n, members, parts)
        excluded = dict(row.excluded)
        missing = sorted(set(range(parts)) - set(results))
        for p in missing:
            excluded[aggregators[p]] = (
                f"partition {p}: no result by the deadline nor from "
                f"{limits.MAX_PARTITION_BACKUPS} backups; it keeps the parent state"
            )
        for peer in members:
            if s.ban_row(peer) is not None:
                excluded[peer] = f"banned; {excluded[peer]}" if peer in excluded else "banned"
        s.set_round(
            n,
            status=str(RoundStatus.AGREED),
            agreed_at=now,
            agreed=sorted(members),
            excluded=excluded,
        )
        self.log(
            now,
            "round_agreed",
            round=n,
            parts=parts,
            missing=missing,
            excluded=excluded,
            silent=silent,
        )

    # -- evidence ---------------------------------------------------------------------------------

    def evidence_target(self, peer: str, n: int, partition: int, header: str) -> ResultRow:
        """The recorded result that evidence from ``peer`` names (refusals as RequestRefused)."""
        _row, _members, parts = self._listed(peer, n)
        if partition >= parts:
            raise RequestRefused(
                E.BAD_REQUEST, f"partition {partition} is not below parts ({parts})"
            )
        recorded = self.store.results(n).get(partition)
        if recorded is None or recorded.header != header:
            now_has = "no result" if recorded is None else f"result {recorded.header}"
            raise RequestRefused(
                E.NOT_RECORDED,
                f"header {header} is not the recorded result of partition {partition} of round "
                f"{n} ({now_has})",
            )
        return recorded

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
        """The coordinator's own recomputation shows the recorded result wrong: ban its signer
        at once and record the recomputed output for that partition (if not already)."""
        recorded = self.store.results(n)[partition]
        if recorded.replaced is None:
            row = self.store.round_row(n)
            if row is not None and row.status is not RoundStatus.AGREED:
                self.store.replace_result(n, partition, recomputed, reporter)
        self.store.append_log(
            now,
            reporter,
            "wrong_result",
            {
                "round": n,
                "partition": partition,
                "claimed": claimed,
                "recomputed": recomputed,
                "reported": reported,
            },
        )
        if self.store.ban_row(signer) is None:
            self.bans.ban(
                signer,
                BanKind.PARTITION,
                f"wrong partition result: round {n} partition {partition}: header names "
                f"{claimed or 'no output'}, recomputation gives {recomputed or 'no output'}",
                reporter,
                now,
                round_=n,
                evidence={
                    "header": recorded.header,
                    "claimed": claimed,
                    "recomputed": recomputed,
                    "reporter": reporter,
                    "reported": reported,  # the reporter's own recomputation
                },
            )
        else:
            self.advance(now)


def _set(at: float | None) -> float:
    """A time the round's status guarantees is set (a published round's publish time and
    collect deadline; a backup step once the result window opened)."""
    assert at is not None, "set by the transition that entered this status"
    return at
