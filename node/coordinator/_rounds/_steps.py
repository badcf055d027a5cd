"""The run's transitions: phases, closing and publishing rounds, agreeing full rounds.

Pure like the rest of the rules (see ``_machine.py``): :meth:`RoundSteps.step` reads the run's
facts and returns the writes of the next due transition, or says the run settled; the HTTP layer
applies each step and asks again. See specs/coordinator.md#rounds and #agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._config import RunConfig
from .._pace import phase_closes_at
from .._store._facts import RoundFacts, RunFacts
from .._store._rows import ACTIVE, MemberStatus, RoundRow
from .._store._writes import Log, OpenRound, SetMember, SetRound, SetRun, Write
from .._wire._protocol import Phase, RoundStatus
from ._partitions import PartitionRules

__all__ = ["RoundSteps", "Step"]


@dataclass(frozen=True)
class Step:
    """One step of :meth:`RoundSteps.step`: the writes of a due transition, or (``settled``)
    none due, with at most the run's `waiting` text to update."""

    writes: list[Write]
    settled: bool


def _log(now: float, kind: str, **detail: Any) -> Log:
    """A coordinator transition's log entry (echoed to the process log)."""
    return Log(now, "coordinator", kind, detail, echo=True)


class RoundSteps:
    """The transitions of one run (``partitions``: the partitioned rounds' own)."""

    def __init__(self, config: RunConfig, partitions: PartitionRules) -> None:
        self.config = config
        self.partitions = partitions

    def next_due(self, f: RunFacts) -> float | None:
        """The earliest time at which ``step`` has something to do without a request."""
        run, dues = f.run, []
        if run.phase in (Phase.WARMUP, Phase.COOLDOWN) and run.phase_until is not None:
            dues.append(run.phase_until)
        row = f.current
        if row.status is RoundStatus.CLOSED and row.deadline is not None:
            dues.append(row.deadline)
        for published in f.published():
            if _row(published.row).parts:
                dues += self.partitions.due(published)
            else:
                dues.append(self._collect_closes_at(published))
        return min(dues) if dues else None

    def step(self, f: RunFacts, now: float) -> Step:
        """The next due transition (each one is logged), or settled."""
        for published in f.published():
            writes = self._published_step(published, now)
            if writes:
                return Step(writes, settled=False)
        if f.run.phase is Phase.TRAINING:
            return self._training_step(f, now)
        return self._phase_step(f, now)

    def _published_step(self, published: RoundFacts, now: float) -> list[Write]:
        """A published round's due transition: its partition rules', or a full round's
        agreement once every member reported `collected` or the pace rule closed the phase."""
        row = _row(published.row)
        if row.parts:
            return self.partitions.step(published, now)
        reports = published.collected()
        if len(reports) >= len(row.members) or now >= self._collect_closes_at(published):
            return self._agree(published, now)
        return []

    def _phase_step(self, f: RunFacts, now: float) -> Step:
        """Out of training: cool-down until the checkpoint, waiting for members, warm-up."""
        r, run = self.config.rounds, f.run
        n = run.round
        active = f.round(n).count(*ACTIVE)
        need = r.min_participants
        if run.phase is Phase.COOLDOWN:
            ckpt = f.latest_checkpoint
            done = ckpt is not None and ckpt.round >= n - 1
            if done or now >= _until(run.phase_until):
                epoch = run.epoch + 1
                why = "checkpoint" if done else "timeout"
                waiting = {"phase": Phase.WAITING_FOR_MEMBERS, "phase_until": None}
                return _moved(
                    SetRun({"epoch": epoch, **waiting}),
                    SetRound(n, {"epoch": epoch}),
                    _log(now, "epoch_started", epoch=epoch, after=why),
                )
            return _waiting(f, f"cooldown: waiting for the checkpoint of round {n - 1}")
        if run.phase is Phase.WAITING_FOR_MEMBERS:
            if active >= need:
                return _moved(
                    SetRun({"phase": Phase.WARMUP, "phase_until": now + r.warmup_s}),
                    _log(now, "phase", phase=str(Phase.WARMUP)),
                )
            return _waiting(f, f"round {n} has {active} of {need} participants")
        # Warm-up
        if active < need:
            return _moved(
                SetRun({"phase": Phase.WAITING_FOR_MEMBERS, "phase_until": None}),
                _log(now, "phase", phase=str(Phase.WAITING_FOR_MEMBERS)),
            )
        if now >= _until(run.phase_until):
            return _moved(
                SetRun({"phase": Phase.TRAINING, "phase_until": None}),
                _log(now, "phase", phase=str(Phase.TRAINING)),
            )
        return _waiting(f, "warmup: joiners fetch the current checkpoint")

    def _training_step(self, f: RunFacts, now: float) -> Step:
        """Training: an open round closes at its first ready member; a closed one publishes
        when every member is ready (at least min_participants), drops the rest at its
        deadline, or reopens when members left."""
        r, n = self.config.rounds, f.run.round
        row, current = f.current, f.round(n)
        active = current.count(*ACTIVE)
        ready = current.count(MemberStatus.READY)
        need = r.min_participants
        if row.status is RoundStatus.OPEN:
            if active < need:
                return _moved(
                    SetRun({"phase": Phase.WAITING_FOR_MEMBERS}),
                    _log(now, "phase", phase=str(Phase.WAITING_FOR_MEMBERS), round=n),
                )
            if ready > 0:
                closed = {
                    "status": RoundStatus.CLOSED,
                    "closed_at": now,
                    "deadline": now + r.round_timeout_s,
                }
                return _moved(
                    SetRound(n, closed), _log(now, "round_closed", round=n, members=active)
                )
            return _waiting(f, None)
        # Closed: the list is fixed; wait for everyone ready, at least `need`, up to the deadline.
        if active < need:
            reopened = {"status": RoundStatus.OPEN, "closed_at": None, "deadline": None}
            return _moved(
                SetRound(n, reopened),
                _log(now, "round_reopened", round=n, members=active, need=need),
            )
        if ready == active:
            return Step(self._publish(f, now), settled=False)
        if now >= _until(row.deadline):
            dropped = current.peers(MemberStatus.JOINED)
            drops = [SetMember(n, peer, {"status": MemberStatus.DROPPED}) for peer in dropped]
            return _moved(*drops, _log(now, "members_dropped", round=n, peers=dropped))
        return _waiting(f, f"round {n}: {active - ready} of {active} members not ready yet")

    def _collect_closes_at(self, f: RoundFacts) -> float:
        """When a full round's input set is decided without the members that have not reported
        `collected`: by the pace rule (_pace.py) from the collect deadline, so a member that is
        slow to fetch delays the decision instead of changing it."""
        row = _row(f.row)
        times = f.report_times("collected_at", row.members)
        return phase_closes_at(
            _until(row.published_at),
            _until(row.collect_deadline),
            times,
            len(row.members),
            self.config.rounds.late_max_s,
        )

    def _publish(self, f: RunFacts, now: float) -> list[Write]:
        r, n = self.config.rounds, f.run.round
        facts = f.round(n)
        members = facts.peers(MemberStatus.READY)
        parts = self.partitions.parts_for(len(members))
        published = {
            "status": RoundStatus.PUBLISHED,
            "published_at": now,
            "members": members,
            "collect_deadline": now + r.collect_timeout_s,
            "parts": parts,
            "aggregators": self.partitions.assign(n, members, parts, facts.public),
        }
        epoch = f.run.epoch
        writes: list[Write] = [
            SetRound(n, published),
            OpenRound(n + 1, epoch, now),
            SetRun({"round": n + 1}),
            _log(now, "round_published", round=n, members=members, parts=parts),
        ]
        if r.checkpoint_every and n % r.checkpoint_every == 0:
            writes += [
                SetRun({"phase": Phase.COOLDOWN, "phase_until": now + r.cooldown_s}),
                _log(now, "phase", phase=str(Phase.COOLDOWN), epoch=epoch, last_round=n),
            ]
        return writes

    def _agree(self, f: RoundFacts, now: float) -> list[Write]:
        """Decide a full round's input set, once, for every node
        (specs/coordinator.md#agreement).

        A member's update is in when a strict majority of the round's members report holding
        it (its author counts when it reported): then most of the swarm has the verified blocks
        and can serve them to the rest. A minority that claims to hold an update cannot force
        it in, a minority that claims to lack one cannot keep it out, and members that stay
        silent (crashed, cut off, wedged) count as not holding it: a lone reporter can never
        make its own update the round.
        """
        row = _row(f.row)
        n, members, reports = row.round, row.members, f.collected()
        headers = f.headers()
        agreed: list[str] = []
        excluded: dict[str, str] = {}
        for peer in members:
            if peer in f.banned:
                excluded[peer] = "banned"
            elif peer not in headers:
                excluded[peer] = "sent no update header"
            else:
                holders = sum(1 for missing in reports.values() if peer not in missing)
                if 2 * holders > len(members):
                    agreed.append(peer)
                else:
                    excluded[peer] = (
                        f"update held by {holders} of the round's {len(members)} members "
                        f"({len(reports)} reported)"
                    )
        decided = {
            "status": RoundStatus.AGREED,
            "agreed_at": now,
            "agreed": agreed,
            "excluded": excluded,
        }
        late = sorted(set(members) - set(reports))
        return [
            SetRound(n, decided),
            _log(now, "round_agreed", round=n, agreed=agreed, excluded=excluded, silent=late),
        ]


def _waiting(f: RunFacts, text: str | None) -> Step:
    """Settled; the run's `waiting` text updated (not logged: derived, shown in the state
    only)."""
    writes: list[Write] = [] if f.run.waiting == text else [SetRun({"waiting": text})]
    return Step(writes, settled=True)


def _moved(*writes: Write) -> Step:
    return Step(list(writes), settled=False)


def _row(row: RoundRow | None) -> RoundRow:
    assert row is not None, "a published round has a row"
    return row


def _until(at: float | None) -> float:
    """A time the round's status guarantees is set (a closed round's deadline, a timed phase's
    end, a published round's times)."""
    assert at is not None, "set by the transition that entered this status"
    return at
