"""The signed views of a run: a round's record, the whole run state, the checkpoint history,
built from the run's facts as the coordinator signs them (specs/coordinator.md#messages). Pure:
the HTTP layer reads the facts, signs the result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._config import RunConfig
from .._store._facts import RoundFacts, RunFacts
from .._store._rows import ACTIVE, BanRow, CheckpointRow, MemberStatus
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
    """The records one run signs, from its facts."""

    def __init__(self, config: RunConfig, coordinator: str, partitions: PartitionRules) -> None:
        self.config = config
        self.coordinator = coordinator
        self.partitions = partitions

    def round_info(
        self, f: RoundFacts, n: int, epoch: int, addrs: Mapping[str, list[str]], now: float
    ) -> RoundInfo:
        """Round ``n``'s record (``epoch``: the run's, for a round not opened yet; ``addrs``:
        the advertised addresses of its members)."""
        joined = f.count(*ACTIVE)
        ready = f.count(MemberStatus.READY)
        row = f.row
        if row is None:
            return RoundInfo(self.config.run, n, epoch, RoundStatus.FUTURE, [], joined, ready, None)
        status, listed = row.status, row.listed
        members = row.members if listed else []
        headers = {k: v for k, v in f.headers().items() if k in members}
        shown = members if listed else f.peers(*ACTIVE)
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
            addrs={p: addrs[p] for p in shown if p in addrs},
            collect_deadline_ms=ms(row.collect_deadline) if listed else None,
            agreed=row.agreed if status is RoundStatus.AGREED else None,
            excluded=row.excluded if listed else {},
            **(self.partitions.info(f, now) if listed else {}),
        )

    def checkpoint_history(self, after: int, rows: Sequence[CheckpointRow]) -> CheckpointHistory:
        """The recorded checkpoints of rounds after ``after`` (one page: ``rows``)."""
        return CheckpointHistory(self.config.run, after, [checkpoint_record(r) for r in rows])

    def run_state(
        self,
        f: RunFacts,
        version: int,
        bans: Sequence[BanRow],
        addrs: Mapping[str, list[str]],
        now: float,
    ) -> RunState:
        """The run state (``f`` holds the current round and the one before)."""
        run = f.run
        n = run.round
        latest = f.latest_checkpoint
        return RunState(
            run=self.config.run,
            coordinator=self.coordinator,
            version=version,
            at_ms=int(now * 1000),
            config=self.config.public_dict(),
            phase=run.phase,
            phase_until_ms=ms(run.phase_until),
            epoch=run.epoch,
            round=self.round_info(f.round(n), n, run.epoch, addrs, now),
            last_round=self.round_info(f.round(n - 1), n - 1, run.epoch, addrs, now)
            if n > 1
            else None,
            waiting=run.waiting,
            checkpoint=None if latest is None else checkpoint_record(latest),
            bans=[
                BanRecord(b.peer, b.username, b.kind, b.reason, b.round, b.by, int(b.at * 1000))
                for b in bans
            ],
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
