"""The run state machine: phases, DISCO-style rounds, checkpoints, bans.

See specs/coordinator.md#rounds. Every method runs inside the caller's ``Store.tx()``; a refusal
raises :class:`RequestRefused` and the transaction rolls back. ``advance(now)`` applies every
transition that is due (list closing, publishing, dropping at the deadline, phase changes) and is
called after each change and by the server's deadline tick, so a restart simply resumes.
"""

from __future__ import annotations

from typing import Any

import structlog

from .. import limits
from .._bans._bans import BanBook
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import RequestRefused
from .._pace import phase_closes_at
from .._store._rows import ACTIVE, CheckpointRow, MemberStatus, RoundRow
from .._store._store import Store
from .._wire._admin import (
    AdminAction,
    AllowlistAdd,
    AllowlistList,
    AllowlistRemove,
    BanPeer,
    LogPage,
    UnbanPeer,
)
from .._wire._ban_records import BanKind
from .._wire._protocol import (
    CheckpointHistory,
    CheckpointRecord,
    Phase,
    RoundInfo,
    RoundStatus,
    RunState,
    ms,
)
from ._partitions import PartitionRules
from ._views import SignedViews, checkpoint_record

__all__ = ["RunMachine"]

log = structlog.get_logger(__name__)


class RunMachine:
    """Rules of one run over its :class:`Store`."""

    def __init__(self, store: Store, config: RunConfig, coordinator: str) -> None:
        self.store = store
        self.config = config
        self.coordinator = coordinator
        self.bans = BanBook(store, self.advance)
        self.partitions = PartitionRules(store, config, self.bans, self.advance, self._log)
        self.views = SignedViews(store, config, coordinator, self.partitions)

    # -- replay -------------------------------------------------------------------------------

    def consume_counter(self, peer: str, counter: int) -> None:
        """Refuse a counter not above the last one this peer used (replay or reordering)."""
        if counter < 0:
            raise RequestRefused(E.BAD_REQUEST, "request counter must be >= 0")
        last = self.store.last_counter(peer)
        if last is not None and counter <= last:
            raise RequestRefused(
                E.REPLAYED, f"request counter {counter} is not above the last one ({last})"
            )
        self.store.set_counter(peer, counter)

    # -- joining ------------------------------------------------------------------------------

    def check_not_banned(self, peer: str, username: str = "") -> None:
        row = self.store.ban_row(peer) or self.store.user_ban(username)
        if row is not None:
            who = f"peer {peer}" if row.peer == peer else f"user {username!r}"
            raise RequestRefused(E.BANNED, f"{who} is banned: {row.reason}")

    def check_may_join(self, peer: str, username: str, orgs: list[str]) -> None:
        self.check_not_banned(peer, username)
        s = self.store
        if s.allowed("peer", peer) or (username and s.allowed("user", username)):
            return
        if username and any(s.allowed("org", org) for org in orgs):
            return
        who = f"user {username!r} (peer {peer})" if username else f"peer {peer}"
        raise RequestRefused(E.NOT_ALLOWLISTED, f"{who} is not on the allowlist of this run")

    def record_join(
        self, peer: str, username: str, now: float, expires: float, addrs: list[str]
    ) -> None:
        self.store.put_peer(peer, username, now, expires, addrs)
        detail = {"username": username, "expires_ms": ms(expires), "addrs": addrs}
        self.store.append_log(now, peer, "join", detail)

    # -- rounds -------------------------------------------------------------------------------

    def join_round(self, peer: str, username: str, now: float) -> int:
        """Enter the current round if its list is open, else the next one; return the round."""
        s = self.store
        current = s.run_row().round
        for n in (current, current + 1):
            row = s.member(n, peer)
            if row is not None and row.active:
                return n  # idempotent: already in
        status = s.current_round_row().status
        target = current if status is RoundStatus.OPEN else current + 1
        if s.count_members(target, *ACTIVE) >= limits.MAX_ROUND_MEMBERS:
            raise RequestRefused(E.ROUND_FULL, f"round {target} has MAX_ROUND_MEMBERS members")
        s.put_member(target, peer, username, now)
        s.append_log(now, peer, "join_round", {"round": target})
        self.advance(now)
        return target

    def _own_membership(self, peer: str, n: int) -> None:
        current = self.store.run_row().round
        if n not in (current, current + 1):
            raise RequestRefused(
                E.ROUND_OVER,
                f"round {n} is not open to changes; the current round is {current}",
            )
        row = self.store.member(n, peer)
        if row is None or not row.active:
            why = "" if row is None else f" ({row.status})"
            raise RequestRefused(E.NOT_MEMBER, f"peer {peer} is not a member of round {n}{why}")

    def ready(self, peer: str, n: int, now: float, header: str | None = None) -> None:
        self._own_membership(peer, n)
        row = self.store.member(n, peer)
        if row is not None and row.status is MemberStatus.READY:
            return
        self.store.set_member(n, peer, status=MemberStatus.READY, ready_at=now, header=header)
        self.store.append_log(now, peer, "ready", {"round": n, "header": header})
        self.advance(now)

    def collected(self, peer: str, n: int, missing: list[str], now: float) -> None:
        """A member of published round ``n`` says whose updates it could not fetch."""
        row = self.store.round_row(n)
        if row is None or not row.listed:
            raise RequestRefused(E.ROUND_NOT_PUBLISHED, f"round {n} has no published list")
        if row.parts:
            raise RequestRefused(
                E.PARTITIONED_ROUND, f"round {n} is partitioned: members report `checked`"
            )
        members = row.members
        if peer not in members:
            raise RequestRefused(E.NOT_MEMBER, f"peer {peer} is not a member of round {n}")
        if row.status is RoundStatus.AGREED:
            return  # decided already (a late or repeated report): the decision stands
        unknown = sorted(set(missing) - set(members))
        if unknown:
            raise RequestRefused(
                E.BAD_REQUEST, f"missing names peers not in round {n}: {unknown[0]}"
            )
        self.store.set_member(n, peer, missing=sorted(set(missing) - {peer}), collected_at=now)
        self.store.append_log(now, peer, "collected", {"round": n, "missing": sorted(missing)})
        self.advance(now)

    def leave(self, peer: str, n: int, now: float) -> None:
        self._own_membership(peer, n)
        self.store.set_member(n, peer, status=MemberStatus.LEFT)
        self.store.append_log(now, peer, "leave", {"round": n})
        self.advance(now)

    # -- transitions --------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest time at which ``advance`` has something to do without a request."""
        s = self.store
        run = s.run_row()
        dues = []
        if run.phase in (Phase.WARMUP, Phase.COOLDOWN) and run.phase_until is not None:
            dues.append(run.phase_until)
        row = s.current_round_row()
        if row.status is RoundStatus.CLOSED and row.deadline is not None:
            dues.append(row.deadline)
        for published in s.rounds_with_status(RoundStatus.PUBLISHED):
            if published.parts:
                dues += self.partitions.due(published)
            else:
                dues.append(self._collect_closes_at(published))
        return min(dues) if dues else None

    def advance(self, now: float) -> None:
        """Apply every due transition; each one is logged. Bounded: each step changes state."""
        for _ in range(64):
            if not self._step(now):
                return
        log.warning("advance_not_settled")

    def _step(self, now: float) -> bool:
        s, r = self.store, self.config.rounds
        for published in s.rounds_with_status(RoundStatus.PUBLISHED):
            if published.parts:
                if self.partitions.step(published, now):
                    return True
                continue
            members = published.members
            reports = s.collected(published.round)
            if len(reports) >= len(members) or now >= self._collect_closes_at(published):
                self._agree(published.round, members, reports, now)
                return True
        run = s.run_row()
        phase, n = run.phase, run.round
        row = s.current_round_row()
        active = s.count_members(n, *ACTIVE)
        ready = s.count_members(n, MemberStatus.READY)
        need = r.min_participants
        if phase is Phase.COOLDOWN:
            ckpt = s.latest_checkpoint()
            done = ckpt is not None and ckpt.round >= n - 1
            if done or now >= _until(run.phase_until):
                epoch = run.epoch + 1
                s.set_run(epoch=epoch, phase=str(Phase.WAITING_FOR_MEMBERS), phase_until=None)
                s.set_round(n, epoch=epoch)
                why = "checkpoint" if done else "timeout"
                self._log(now, "epoch_started", epoch=epoch, after=why)
                return True
            return self._waiting(f"cooldown: waiting for the checkpoint of round {n - 1}")
        if phase is Phase.WAITING_FOR_MEMBERS:
            if active >= need:
                s.set_run(phase=str(Phase.WARMUP), phase_until=now + r.warmup_s)
                self._log(now, "phase", phase=str(Phase.WARMUP))
                return True
            return self._waiting(f"round {n} has {active} of {need} participants")
        if phase is Phase.WARMUP:
            if active < need:
                s.set_run(phase=str(Phase.WAITING_FOR_MEMBERS), phase_until=None)
                self._log(now, "phase", phase=str(Phase.WAITING_FOR_MEMBERS))
                return True
            if now >= _until(run.phase_until):
                s.set_run(phase=str(Phase.TRAINING), phase_until=None)
                self._log(now, "phase", phase=str(Phase.TRAINING))
                return True
            return self._waiting("warmup: joiners fetch the current checkpoint")
        # Training
        if row.status is RoundStatus.OPEN:
            if active < need:
                s.set_run(phase=str(Phase.WAITING_FOR_MEMBERS))
                self._log(now, "phase", phase=str(Phase.WAITING_FOR_MEMBERS), round=n)
                return True
            if ready > 0:
                s.set_round(
                    n,
                    status=str(RoundStatus.CLOSED),
                    closed_at=now,
                    deadline=now + r.round_timeout_s,
                )
                self._log(now, "round_closed", round=n, members=active)
                return True
            return self._waiting(None)
        # Closed: the list is fixed; wait for everyone ready, at least `need`, up to the deadline.
        if active < need:
            s.set_round(n, status=str(RoundStatus.OPEN), closed_at=None, deadline=None)
            self._log(now, "round_reopened", round=n, members=active, need=need)
            return True
        if ready == active:
            self._publish(n, now)
            return True
        if now >= _until(row.deadline):
            dropped = s.members(n, MemberStatus.JOINED)
            for peer in dropped:
                s.set_member(n, peer, status=MemberStatus.DROPPED)
            self._log(now, "members_dropped", round=n, peers=dropped)
            return True
        return self._waiting(f"round {n}: {active - ready} of {active} members not ready yet")

    def _collect_closes_at(self, row: RoundRow) -> float:
        """When a full round's input set is decided without the members that have not reported
        `collected`: by the pace rule (_pace.py) from the collect deadline, so a member that is
        slow to fetch delays the decision instead of changing it."""
        members = row.members
        times = self.store.report_times(row.round, "collected_at", members)
        return phase_closes_at(
            _until(row.published_at),
            _until(row.collect_deadline),
            times,
            len(members),
            self.config.rounds.late_max_s,
        )

    def _waiting(self, text: str | None) -> bool:
        if self.store.run_row().waiting != text:
            self.store.set_run(waiting=text)  # not logged: derived, shown in the state only
        return False

    def _publish(self, n: int, now: float) -> None:
        s, r = self.store, self.config.rounds
        members = s.members(n, MemberStatus.READY)
        parts = self.partitions.parts_for(len(members))
        s.set_round(
            n,
            status=str(RoundStatus.PUBLISHED),
            published_at=now,
            members=members,
            collect_deadline=now + r.collect_timeout_s,
            parts=parts,
        )
        epoch = s.run_row().epoch
        s.open_round(n + 1, epoch, now)
        s.set_run(round=n + 1)
        self._log(now, "round_published", round=n, members=members, parts=parts)
        if r.checkpoint_every and n % r.checkpoint_every == 0:
            s.set_run(phase=str(Phase.COOLDOWN), phase_until=now + r.cooldown_s)
            self._log(now, "phase", phase=str(Phase.COOLDOWN), epoch=epoch, last_round=n)

    def _agree(self, n: int, members: list[str], reports: dict[str, list[str]], now: float) -> None:
        """Decide round ``n``'s input set, once, for every node (specs/coordinator.md#agreement).

        A member's update is in when a strict majority of the round's members report holding
        it (its author counts when it reported): then most of the swarm has the verified blocks
        and can serve them to the rest. A minority that claims to hold an update cannot force
        it in, a minority that claims to lack one cannot keep it out, and members that stay
        silent (crashed, cut off, wedged) count as not holding it: a lone reporter can never
        make its own update the round.
        """
        headers = self.store.headers(n)
        agreed: list[str] = []
        excluded: dict[str, str] = {}
        for peer in members:
            if self.store.ban_row(peer) is not None:
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
        self.store.set_round(
            n,
            status=str(RoundStatus.AGREED),
            agreed_at=now,
            agreed=agreed,
            excluded=excluded,
        )
        late = sorted(set(members) - set(reports))
        self._log(now, "round_agreed", round=n, agreed=agreed, excluded=excluded, silent=late)

    def _log(self, now: float, kind: str, **detail: Any) -> None:
        self.store.append_log(now, "coordinator", kind, detail)
        log.info(kind, **detail)

    # -- administration -----------------------------------------------------------------------

    def admin(self, action: AdminAction, signer: str, now: float) -> dict[str, Any]:
        """Apply one admin action (the caller checked ``signer`` is an admin)."""
        s, by = self.store, f"admin:{signer}"  # the change log's actor
        match action:
            case AllowlistAdd(kind, value):
                if s.allowlist_size() >= limits.MAX_ALLOWLIST:
                    raise RequestRefused(E.ALLOWLIST_FULL, "allowlist has MAX_ALLOWLIST entries")
                added = s.allow(kind, value, by, now)
                s.append_log(now, by, "allowlist_add", {"kind": kind, "value": value})
                return {"changed": added}
            case AllowlistRemove(kind, value):
                removed = s.disallow(kind, value)
                s.append_log(now, by, "allowlist_remove", {"kind": kind, "value": value})
                return {"changed": removed}
            case AllowlistList():
                return {"allowlist": s.allowlist()}
            case BanPeer(peer, reason):
                self.bans.ban(peer, BanKind.ADMIN, reason, signer, now)
                return {}
            case UnbanPeer(peer):
                self.bans.unban(peer, by, now)
                return {}
            case LogPage(after, limit):
                return {"log": [entry.to_json() for entry in s.log_page(after, limit)]}
        raise AssertionError(f"unhandled admin action {action!r}")

    # -- checkpoints --------------------------------------------------------------------------

    def submit_checkpoint(
        self, peer: str, record: CheckpointRecord, now: float
    ) -> CheckpointRecord:
        s, n = self.store, record.round
        checkpointers = self.config.access.checkpointers
        row = s.round_row(n)
        if row is None or not row.listed:
            raise RequestRefused(E.ROUND_NOT_PUBLISHED, f"round {n} has no published list")
        if peer not in (checkpointers or row.members):
            raise RequestRefused(E.NOT_CHECKPOINTER, f"peer {peer} may not checkpoint round {n}")
        if row.epoch != record.epoch:
            raise RequestRefused(
                E.WRONG_EPOCH, f"round {n} belongs to epoch {row.epoch}, not {record.epoch}"
            )
        latest = s.latest_checkpoint()
        if latest is not None and latest.round >= n:
            if latest.round == n and latest.manifest == record.manifest:
                return checkpoint_record(latest)  # the same result from another member: agreed
            raise RequestRefused(
                E.STALE_ROUND,
                f"a manifest for round {n} is not newer than the current checkpoint "
                f"(round {latest.round}, {latest.manifest})",
            )
        stored = CheckpointRow(
            n, record.epoch, record.manifest, record.hf_repo, record.hf_revision, peer, now
        )
        s.put_checkpoint(stored)
        s.append_log(now, peer, "checkpoint", {"round": n, "manifest": record.manifest})
        self.advance(now)
        return checkpoint_record(stored)

    # -- signed views (``_views.SignedViews``) -----------------------------------------------

    def round_info(self, n: int) -> RoundInfo:
        return self.views.round_info(n)

    def checkpoint_history(self, after: int, limit: int) -> CheckpointHistory:
        return self.views.checkpoint_history(after, limit)

    def run_state(self, now: float) -> RunState:
        return self.views.run_state(now)


def _until(at: float | None) -> float:
    """A time the round's status guarantees is set (a closed round's deadline, a timed phase's
    end, a published round's times)."""
    assert at is not None, "set by the transition that entered this status"
    return at
