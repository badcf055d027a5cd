"""The signed views of a run: a round's record, the whole run state, the checkpoint history,
built from the store as the coordinator signs them (specs/coordinator.md#messages)."""

from __future__ import annotations

from .._config import RunConfig
from .._store._rows import ACTIVE, CheckpointRow, MemberStatus
from .._store._store import Store
from .._wire._ban_records import BanRecord
from .._wire._protocol import (
    CheckpointHistory,
    CheckpointRecord,
    RoundInfo,
    RoundStatus,
    RunState,
    ms,
)
from ._partitions import PartitionRules

__all__ = ["SignedViews", "checkpoint_record"]


class SignedViews:
    """Reads of one run's store, in the shape the coordinator signs (inside the caller's tx)."""

    def __init__(
        self, store: Store, config: RunConfig, coordinator: str, partitions: PartitionRules
    ) -> None:
        self.store = store
        self.config = config
        self.coordinator = coordinator
        self.partitions = partitions

    def round_info(self, n: int) -> RoundInfo:
        s = self.store
        run = s.run_row()
        row = s.round_row(n)
        joined = s.count_members(n, *ACTIVE)
        ready = s.count_members(n, MemberStatus.READY)
        if row is None:
            return RoundInfo(
                self.config.run, n, run.epoch, RoundStatus.FUTURE, [], joined, ready, None
            )
        status, listed = row.status, row.listed
        members = row.members if listed else []
        headers = {k: v for k, v in s.headers(n).items() if k in members}
        shown = members if listed else s.members(n, *ACTIVE)
        return RoundInfo(
            self.config.run,
            n,
            row.epoch,
            status,
            members,
            joined,
            ready,
            ms(row.deadline) if status is RoundStatus.CLOSED else None,
            headers,
            addrs=s.peer_addrs(shown),
            collect_deadline_ms=ms(row.collect_deadline) if listed else None,
            agreed=row.agreed if status is RoundStatus.AGREED else None,
            excluded=row.excluded if listed else {},
            **(self.partitions.info(n, row) if listed else {}),
        )

    def checkpoint_history(self, after: int, limit: int) -> CheckpointHistory:
        """Every recorded checkpoint of a round after ``after`` (a page of at most ``limit``)."""
        rows = self.store.checkpoint_rows(after, limit)
        return CheckpointHistory(self.config.run, after, [checkpoint_record(r) for r in rows])

    def run_state(self, now: float) -> RunState:
        s = self.store
        run = s.run_row()
        n = run.round
        latest = s.latest_checkpoint()
        bans = [
            BanRecord(b.peer, b.username, b.kind, b.reason, b.round, b.by, int(b.at * 1000))
            for b in s.ban_rows()
        ]
        return RunState(
            run=self.config.run,
            coordinator=self.coordinator,
            version=s.version(),
            at_ms=int(now * 1000),
            config=self.config.public_dict(),
            phase=run.phase,
            phase_until_ms=ms(run.phase_until),
            epoch=run.epoch,
            round=self.round_info(n),
            last_round=self.round_info(n - 1) if n > 1 else None,
            waiting=run.waiting,
            checkpoint=None if latest is None else checkpoint_record(latest),
            bans=bans,
        )


def checkpoint_record(row: CheckpointRow) -> CheckpointRecord:
    """A stored checkpoint row as its signed record."""
    return CheckpointRecord(
        row.epoch,
        row.round,
        row.manifest,
        row.hf_repo,
        row.hf_revision,
        row.submitter,
        int(row.at * 1000),
    )
