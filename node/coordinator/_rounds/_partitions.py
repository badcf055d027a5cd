"""The coordinator's rules for partitioned rounds (specs/coordinator.md#partitioned-rounds).

A partitioned round is published with ``parts`` > 0: member ``aggregators[p]`` aggregates
partition ``p`` of everyone's update and records its signed partition result header here (op
`result`); the first accepted header of a partition stands, so no aggregator can show different
results to different nodes. Backups take a silent partition over one after another, a step
apart, once the aggregator had the first step of the result window (its start and step follow
the round's measured pace: ``_pace.py``). Once every partition has a result, members recompute
the partitions chosen for them and report `checked`; a wrong result is self-proving evidence,
which the coordinator recomputes itself (``_evidence.py``) and bans its signer at once.

Pure logic like :class:`RunMachine`, which holds it: each method reads a round's facts
(``RoundFacts``: its row, members, results, banned members) and returns the writes it decides;
the HTTP layer applies them in the request's transaction.
"""

from __future__ import annotations

from typing import Any

from cnode.aggregation import assign_partitions, backup_aggregators, partition_count
from cnode.aggregation import limits as aggregation_limits
from cnode.storage import DAG_CBOR, compute_cid

from .. import limits
from .._bans._bans import BanBook
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import RequestRefused
from .._store._facts import RoundFacts, RunFacts
from .._store._rows import ResultRow, RoundRow
from .._store._writes import Log, PutResult, ReplaceResult, SetMember, SetRound, Write
from .._wire._ban_records import BanKind
from .._wire._protocol import PartitionResultEntry, RoundStatus, ms
from ._clock import PartitionClock, listed_row, set_time

__all__ = ["PartitionRules"]


def _log(now: float, kind: str, **detail: Any) -> Log:
    """A coordinator transition's log entry (echoed to the process log)."""
    return Log(now, "coordinator", kind, detail, echo=True)


class PartitionRules:
    """Partitioned rounds of one run: decisions over a round's facts, no I/O.

    An accepted result or report may finish the round: the caller advances the run after
    applying the writes, as after any change.
    """

    def __init__(self, config: RunConfig, bans: BanBook) -> None:
        self.config = config
        self.bans = bans
        self.clock = PartitionClock(config)

    def scores_closed(self, f: RoundFacts, now: float) -> bool:
        """See :meth:`PartitionClock.scores_closed`."""
        return self.clock.scores_closed(f, now)

    def due(self, f: RoundFacts) -> list[float]:
        """See :meth:`PartitionClock.due`."""
        return self.clock.due(f)

    # -- publishing -----------------------------------------------------------------------------

    def parts_for(self, members: int) -> int:
        """0 (full replication) or the partition count of a round of ``members`` members."""
        if members < 1 or not self.config.partition_rounds(members):
            return 0
        return partition_count(members, aggregation_limits.SEGMENTS)

    def assign(self, n: int, members: list[str], parts: int, public: frozenset[str]) -> list[str]:
        """Who aggregates each partition of round ``n``, fixed at publish: the public members
        only, when some members are outbound-only and some are not (issue 37). An aggregator
        must fetch every member's segments of its partition, and an outbound-only member can
        open no connection to another outbound-only one, while every member reaches a public
        one; so public members aggregate (several partitions each, in their ranked order) and
        outbound-only members verify and score (specs/coordinator.md#reachability)."""
        if not parts:
            return []
        eligible = [m for m in members if m in public]
        if not eligible or len(eligible) == len(members):
            return assign_partitions(self.config.run, n, members, parts)
        order = assign_partitions(self.config.run, n, eligible, len(eligible))
        return [order[p % len(order)] for p in range(parts)]

    def aggregators(self, row: RoundRow) -> list[str]:
        """Round ``row``'s aggregator per partition: as fixed at publish, or (a row published
        before that was stored) the assignment over every member."""
        if row.aggregators is not None:
            return list(row.aggregators)
        return (
            assign_partitions(self.config.run, row.round, row.members, row.parts)
            if row.parts
            else []
        )

    def info(self, f: RoundFacts, now: float) -> dict[str, Any]:
        """The RoundInfo keyword arguments of a listed round's partitioned fields."""
        row = listed_row(f)
        parts = row.parts
        if parts == 0:
            return {}
        results = {
            str(p): PartitionResultEntry(r.peer, r.header, r.replaced, r.by)
            for p, r in f.results.items()
        }
        return {
            "parts": parts,
            "aggregators": self.aggregators(row),
            "results": results,
            "verify_deadline_ms": ms(row.verify_deadline),
            "scores": f.score_records(),
            "scores_closed": self.clock.scores_closed(f, now),
            "results_open_ms": ms(row.results_open),
            "backup_step_ms": ms(row.backup_step),
        }

    # -- ops ------------------------------------------------------------------------------------

    def _listed(self, f: RoundFacts, peer: str, n: int) -> tuple[RoundRow, list[str], int]:
        row = f.row
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

    def result(
        self, f: RoundFacts, peer: str, n: int, partition: int, header: str, now: float
    ) -> list[Write]:
        """Record ``peer``'s result header of ``partition``, if it may submit it now."""
        row, members, parts = self._listed(f, peer, n)
        if partition >= parts:
            raise RequestRefused(
                E.BAD_REQUEST, f"partition {partition} is not below parts ({parts})"
            )
        recorded = f.results.get(partition)
        if recorded is not None:
            if recorded.peer == peer and recorded.header == header:
                return []  # the same result again (a resend): already recorded
            raise RequestRefused(
                E.RESULT_RECORDED,
                f"partition {partition} of round {n} already has a result: {recorded.header}"
                f" from {recorded.peer}",
            )
        if row.status is RoundStatus.AGREED:
            raise RequestRefused(E.ROUND_OVER, f"round {n} is agreed; results are closed")
        aggregator = self.aggregators(row)[partition]
        if peer != aggregator:
            self._check_backup(peer, n, members, partition, aggregator, row, now)
        writes: list[Write] = [PutResult(n, partition, peer, header, now)]
        detail: dict[str, Any] = {"round": n, "partition": partition, "header": header}
        if peer != aggregator:
            excluded = dict(row.excluded)
            excluded[aggregator] = (
                f"partition {partition}: no result by the deadline; aggregated by backup {peer}"
            )
            writes.append(SetRound(n, {"excluded": excluded}))
            detail["backup_for"] = aggregator
        writes.append(Log(now, peer, "result", detail))
        return writes

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

    def score(
        self, f: RoundFacts, peer: str, n: int, data: bytes, now: float
    ) -> tuple[str, list[Write]]:
        """Record ``peer``'s signed score record for round ``n`` and return its CID: one per
        member, the first stands, none once the round's score records are closed
        (specs/coordinator.md#scores-in-partitioned-rounds). Its signature was checked; its
        payload is the nodes' to judge (they ignore what a record may not say)."""
        record = str(compute_cid(data, DAG_CBOR))
        _row, _members, _parts = self._listed(f, peer, n)
        scores = f.score_records()
        if peer in scores:
            if scores[peer] == record:
                return record, []  # the same record again (a resend): already recorded
            raise RequestRefused(
                E.SCORE_RECORDED, f"round {n} already has {peer}'s score record {scores[peer]}"
            )
        if self.clock.scores_closed(f, now):
            raise RequestRefused(
                E.SCORES_CLOSED, f"round {n}'s score records are closed (deadline passed)"
            )
        fields = {"score_record": record, "scored_at": now, "score_bytes": data}
        return record, [
            SetMember(n, peer, fields),
            Log(now, peer, "score", {"round": n, "record": record}),
        ]

    def checked(
        self, f: RoundFacts, peer: str, n: int, wrong: list[int], now: float
    ) -> list[Write]:
        """A member recomputed its chosen partitions; ``wrong`` are those it found wrong."""
        row, _members, parts = self._listed(f, peer, n)
        if row.status is RoundStatus.AGREED:
            return []  # decided already (a late or repeated report): the decision stands
        bad = [p for p in wrong if p >= parts]
        if bad:
            raise RequestRefused(
                E.BAD_REQUEST, f"field 'wrong' names partition {bad[0]}, not below {parts}"
            )
        missing = sorted(set(range(parts)) - set(f.results))
        if missing:
            raise RequestRefused(
                E.RESULTS_PENDING,
                f"round {n}: partition(s) {missing[:8]} have no result yet; check after all do",
            )
        return [
            SetMember(n, peer, {"checked": list(wrong), "checked_at": now}),
            Log(now, peer, "checked", {"round": n, "wrong": wrong}),
        ]

    # -- transitions ------------------------------------------------------------------------------

    def step(self, f: RoundFacts, now: float) -> list[Write]:
        """The writes of one due transition of a published partitioned round; [] when none."""
        r, row = self.config.rounds, listed_row(f)
        n, parts = row.round, row.parts
        results = f.results
        if len(results) == parts:
            if row.verify_deadline is None:
                return [
                    SetRound(n, {"verify_deadline": now + r.verify_timeout_s}),
                    _log(now, "results_complete", round=n, parts=parts),
                ]
            members = row.members
            silent = sorted(p for p in set(members) - set(f.checked()) if p not in f.banned)
            if not silent or now >= self.clock.verify_closes_at(f):
                return self._agree(f, now, silent=silent)
            return []
        if row.results_open is None:
            if now < self.clock.results_open_at(f):
                return []
            step = self.clock.backup_step(f)
            return [
                SetRound(n, {"results_open": now, "backup_step": step}),
                _log(now, "results_window", round=n, step=step),
            ]
        steps = row.backup_steps
        start, step = row.results_open, set_time(row.backup_step)
        if now < start + (steps + 1) * step:
            return []
        if steps < limits.MAX_PARTITION_BACKUPS:
            members = row.members
            missing = sorted(set(range(parts)) - set(results))
            backups = {}
            for p in missing:
                order = backup_aggregators(self.config.run, n, members, p)
                backups[p] = order[steps] if steps < len(order) else None
            return [
                SetRound(n, {"backup_steps": steps + 1}),
                _log(now, "partition_backups_due", round=n, step=steps, backups=backups),
            ]
        return self._agree(f, now, silent=[])

    def _agree(self, f: RoundFacts, now: float, *, silent: list[str]) -> list[Write]:
        """Agree the partitioned round: every member listed, ``excluded`` says who did not
        deliver a partition and who is banned; partitions without a result keep the parent."""
        row, results = listed_row(f), f.results
        n, parts = row.round, row.parts
        members = row.members
        aggregators = self.aggregators(row)
        excluded = dict(row.excluded)
        missing = sorted(set(range(parts)) - set(results))
        for p in missing:
            excluded[aggregators[p]] = (
                f"partition {p}: no result by the deadline nor from "
                f"{limits.MAX_PARTITION_BACKUPS} backups; it keeps the parent state"
            )
        for peer in members:
            if peer in f.banned:
                excluded[peer] = f"banned; {excluded[peer]}" if peer in excluded else "banned"
        agreed = {
            "status": RoundStatus.AGREED,
            "agreed_at": now,
            "agreed": sorted(members),
            "excluded": excluded,
        }
        return [
            SetRound(n, agreed),
            _log(
                now,
                "round_agreed",
                round=n,
                parts=parts,
                missing=missing,
                excluded=excluded,
                silent=silent,
            ),
        ]

    # -- evidence ---------------------------------------------------------------------------------

    def evidence_target(
        self, f: RoundFacts, peer: str, n: int, partition: int, header: str
    ) -> ResultRow:
        """The recorded result that evidence from ``peer`` names (refusals as RequestRefused)."""
        _row, _members, parts = self._listed(f, peer, n)
        if partition >= parts:
            raise RequestRefused(
                E.BAD_REQUEST, f"partition {partition} is not below parts ({parts})"
            )
        recorded = f.results.get(partition)
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
        f: RunFacts,
        reporter: str,
        n: int,
        partition: int,
        *,
        signer: str,
        signer_username: str,
        claimed: str,
        recomputed: str,
        reported: str,
        now: float,
    ) -> list[Write]:
        """The coordinator's own recomputation shows the recorded result wrong: ban its signer
        at once and record the recomputed output for that partition (if not already)."""
        rf = f.round(n)
        recorded = rf.results[partition]
        writes: list[Write] = []
        agreed = rf.row is None or rf.row.status is RoundStatus.AGREED
        if recorded.replaced is None and not agreed:
            writes.append(ReplaceResult(n, partition, recomputed, reporter))
        log = Log(
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
        writes.append(log)
        if signer not in rf.banned:
            writes += self.bans.ban(
                f,
                signer,
                signer_username,
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
        return writes
