"""The run state machine: phases, DISCO-style rounds, checkpoints, bans.

See specs/coordinator.md#rounds. Pure logic over typed rows, like httpx's sans-I/O core: every
operation reads the run's facts (``RunFacts``, gathered by the store) and returns the writes it
decides (``_store/_writes.py``); a refusal raises :class:`RequestRefused` before anything is
written. ``step(facts, now)`` decides one due transition (list closing, publishing, dropping at
the deadline, phase changes); the HTTP layer applies it and asks again until the run settles,
after each change and on its deadline tick, so a restart simply resumes.
"""

from __future__ import annotations

from typing import Any

from .. import limits
from .._bans._bans import BanBook
from .._codes import ErrorCode as E
from .._config import RunConfig
from .._exceptions import RequestRefused
from .._store._facts import RunFacts
from .._store._rows import ACTIVE, BanRow, CheckpointRow, MemberStatus
from .._store._writes import (
    Allow,
    Disallow,
    Log,
    PutCheckpoint,
    PutMember,
    PutPeer,
    SetCounter,
    SetMember,
    Write,
)
from .._wire._admin import AllowKind
from .._wire._protocol import CheckpointRecord, RoundStatus, ms
from ._partitions import PartitionRules
from ._steps import RoundSteps, Step
from ._views import checkpoint_record

__all__ = ["RunMachine"]


def _log(now: float, kind: str, **detail: Any) -> Log:
    """A coordinator transition's log entry (echoed to the process log)."""
    return Log(now, "coordinator", kind, detail, echo=True)


class RunMachine:
    """Rules of one run: decisions over its facts, no I/O."""

    def __init__(self, config: RunConfig, coordinator: str) -> None:
        self.config = config
        self.coordinator = coordinator
        self.bans = BanBook()
        self.partitions = PartitionRules(config, self.bans)
        self.steps = RoundSteps(config, self.partitions)

    # -- replay -------------------------------------------------------------------------------

    def consume_counter(self, peer: str, counter: int, last: int | None) -> list[Write]:
        """Refuse a counter not above ``last``, the last one this peer used (replay or
        reordering)."""
        if counter < 0:
            raise RequestRefused(E.BAD_REQUEST, "request counter must be >= 0")
        if last is not None and counter <= last:
            raise RequestRefused(
                E.REPLAYED, f"request counter {counter} is not above the last one ({last})"
            )
        return [SetCounter(peer, counter)]

    # -- joining ------------------------------------------------------------------------------

    @staticmethod
    def check_not_banned(peer: str, username: str, ban: BanRow | None) -> None:
        """Refuse a banned peer or user (``ban``: the peer's ban, else its user's, if any)."""
        if ban is not None:
            who = f"peer {peer}" if ban.peer == peer else f"user {username!r}"
            raise RequestRefused(E.BANNED, f"{who} is banned: {ban.reason}")

    @staticmethod
    def may_join_entries(peer: str, username: str, orgs: list[str]) -> list[tuple[str, str]]:
        """The allowlist entries any of which admits this joiner (the store says which exist)."""
        entries: list[tuple[str, str]] = [(AllowKind.PEER, peer)]
        if username:
            entries += [(AllowKind.USER, username), *((AllowKind.ORG, org) for org in orgs)]
        return entries

    def check_may_join(
        self, peer: str, username: str, ban: BanRow | None, listed: list[tuple[str, str]]
    ) -> None:
        """Refuse a banned joiner, and one none of whose entries (``may_join_entries``) is
        on the allowlist (``listed``: those that are)."""
        self.check_not_banned(peer, username, ban)
        if listed:
            return
        who = f"user {username!r} (peer {peer})" if username else f"peer {peer}"
        raise RequestRefused(E.NOT_ALLOWLISTED, f"{who} is not on the allowlist of this run")

    @staticmethod
    def record_join(
        peer: str, username: str, now: float, expires: float, addrs: list[str]
    ) -> list[Write]:
        detail = {"username": username, "expires_ms": ms(expires), "addrs": addrs}
        return [PutPeer(peer, username, now, expires, addrs), Log(now, peer, "join", detail)]

    # -- rounds -------------------------------------------------------------------------------

    def join_round(
        self, f: RunFacts, peer: str, username: str, now: float
    ) -> tuple[int, list[Write]]:
        """Enter the current round if its list is open, else the next one; return the round."""
        current = f.run.round
        for n in (current, current + 1):
            row = f.round(n).members.get(peer)
            if row is not None and row.active:
                return n, []  # idempotent: already in
        target = current if f.current.status is RoundStatus.OPEN else current + 1
        if f.round(target).count(*ACTIVE) >= limits.MAX_ROUND_MEMBERS:
            raise RequestRefused(E.ROUND_FULL, f"round {target} has MAX_ROUND_MEMBERS members")
        return target, [
            PutMember(target, peer, username, now),
            Log(now, peer, "join_round", {"round": target}),
        ]

    def _own_membership(self, f: RunFacts, peer: str, n: int) -> MemberStatus:
        current = f.run.round
        if n not in (current, current + 1):
            raise RequestRefused(
                E.ROUND_OVER,
                f"round {n} is not open to changes; the current round is {current}",
            )
        row = f.round(n).members.get(peer)
        if row is None or not row.active:
            why = "" if row is None else f" ({row.status})"
            raise RequestRefused(E.NOT_MEMBER, f"peer {peer} is not a member of round {n}{why}")
        return row.status

    def ready(
        self, f: RunFacts, peer: str, n: int, now: float, header: str | None = None
    ) -> list[Write]:
        if self._own_membership(f, peer, n) is MemberStatus.READY:
            return []
        ready = {"status": MemberStatus.READY, "ready_at": now, "header": header}
        return [SetMember(n, peer, ready), Log(now, peer, "ready", {"round": n, "header": header})]

    def collected(
        self, f: RunFacts, peer: str, n: int, missing: list[str], now: float
    ) -> list[Write]:
        """A member of published round ``n`` says whose updates it could not fetch."""
        row = f.round(n).row
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
            return []  # decided already (a late or repeated report): the decision stands
        unknown = sorted(set(missing) - set(members))
        if unknown:
            raise RequestRefused(
                E.BAD_REQUEST, f"missing names peers not in round {n}: {unknown[0]}"
            )
        report = {"missing": sorted(set(missing) - {peer}), "collected_at": now}
        return [
            SetMember(n, peer, report),
            Log(now, peer, "collected", {"round": n, "missing": sorted(missing)}),
        ]

    def leave(self, f: RunFacts, peer: str, n: int, now: float) -> list[Write]:
        self._own_membership(f, peer, n)
        return [
            SetMember(n, peer, {"status": MemberStatus.LEFT}),
            Log(now, peer, "leave", {"round": n}),
        ]

    # -- transitions (``_steps.RoundSteps``) ---------------------------------------------------

    def next_due(self, f: RunFacts) -> float | None:
        """The earliest time at which ``step`` has something to do without a request."""
        return self.steps.next_due(f)

    def step(self, f: RunFacts, now: float) -> Step:
        """The next due transition (each one is logged), or settled."""
        return self.steps.step(f, now)

    # -- administration -----------------------------------------------------------------------

    @staticmethod
    def allowlist_add(
        kind: str, value: str, signer: str, now: float, *, size: int, present: bool
    ) -> tuple[bool, list[Write]]:
        """Add an entry (``size``: the allowlist's; ``present``: the entry is on it already);
        return whether it changed."""
        by = f"admin:{signer}"  # the change log's actor
        if size >= limits.MAX_ALLOWLIST:
            raise RequestRefused(E.ALLOWLIST_FULL, "allowlist has MAX_ALLOWLIST entries")
        writes: list[Write] = [] if present else [Allow(kind, value, by, now)]
        return not present, [*writes, Log(now, by, "allowlist_add", {"kind": kind, "value": value})]

    @staticmethod
    def allowlist_remove(
        kind: str, value: str, signer: str, now: float, *, present: bool
    ) -> tuple[bool, list[Write]]:
        by = f"admin:{signer}"
        writes: list[Write] = [Disallow(kind, value)] if present else []
        return present, [*writes, Log(now, by, "allowlist_remove", {"kind": kind, "value": value})]

    # -- checkpoints --------------------------------------------------------------------------

    def submit_checkpoint(
        self, f: RunFacts, peer: str, record: CheckpointRecord, now: float
    ) -> tuple[CheckpointRecord, list[Write]]:
        n = record.round
        checkpointers = self.config.access.checkpointers
        row = f.round(n).row
        if row is None or not row.listed:
            raise RequestRefused(E.ROUND_NOT_PUBLISHED, f"round {n} has no published list")
        if peer not in (checkpointers or row.members):
            raise RequestRefused(E.NOT_CHECKPOINTER, f"peer {peer} may not checkpoint round {n}")
        if row.epoch != record.epoch:
            raise RequestRefused(
                E.WRONG_EPOCH, f"round {n} belongs to epoch {row.epoch}, not {record.epoch}"
            )
        latest = f.latest_checkpoint
        if latest is not None and latest.round >= n:
            if latest.round == n and latest.manifest == record.manifest:
                # the same result from another member: agreed
                return checkpoint_record(latest), []
            raise RequestRefused(
                E.STALE_ROUND,
                f"a manifest for round {n} is not newer than the current checkpoint "
                f"(round {latest.round}, {latest.manifest})",
            )
        stored = CheckpointRow(
            n, record.epoch, record.manifest, record.hf_repo, record.hf_revision, peer, now
        )
        return checkpoint_record(stored), [
            PutCheckpoint(stored),
            Log(now, peer, "checkpoint", {"round": n, "manifest": record.manifest}),
        ]
