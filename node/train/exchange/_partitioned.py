"""The exchange of one partitioned round: aggregate a partition, verify others, assemble.

Message by message (specs/training.md#partitioned-rounds):

1. **Aggregate.** The published round names each partition's aggregator
   (``RoundInfo.aggregators``). This node, if it is one, fetches the partition's segments of every
   listed update (and its signed header), aggregates them, stores the output and reports the CID
   of its signed :class:`PartitionResult` (op ``result``).
2. **Back up.** A partition without a result passes to its backups in a fixed order, one step
   apart, after the aggregator's own first step of the result window (the window and its step
   are in the round record: the coordinator sets them from the round's pace,
   specs/coordinator.md#pace); a backup aggregates it the same way.
3. **Verify.** Once every partition has a recorded result, the seed (sha256 over the recorded
   result CIDs) picks ``training.verify_partitions`` other partitions this node recomputes. A
   result that differs goes to the coordinator as self-proving evidence (a CAR); the coordinator
   recomputes it, bans the signer and records the right output. Then the node reports
   ``checked``.
4. **Assemble.** The agreed round names each partition's output (the recomputed one where a
   result was wrong); the node fetches them and adds them to its state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog
import trio

from cnode.aggregation import backup_aggregators, partition_quorum
from cnode.node.coordinator import (
    CoordinatorClient,
    CoordinatorRejected,
    RoundInfo,
)
from cnode.node.coordinator import limits as coordinator_limits
from cnode.node.p2p import P2PNode, fetch_purpose
from cnode.storage import CID, StorageError

from .. import limits
from .._exceptions import (
    OutputsUnavailableError,
    PeerUpdateError,
    RoundStalledError,
    StateMismatchError,
    UnreachableError,
)
from .._round import UpdateHeader, open_update_header
from .._trainer import NodeTrainer, RoundOutcome
from ..partition import (
    PartitionResult,
    input_segments,
    open_partition_result,
    partition_result_cid,
    state_numel,
)
from ..scores import SpreadScores
from ._clock import Clock
from ._fetch import GaveUp, MemberFetcher, fetch_update_segments, with_retries
from ._outputs import fetch_outputs
from ._scores import PartitionScores
from ._verify import PartitionVerifier

__all__ = ["PartitionedExchange"]

log = structlog.get_logger(__name__)


@dataclass
class _Round:
    """What this node knows of one partitioned round while it plays it."""

    info: RoundInfo
    numel: int
    headers: dict[str, tuple[CID, UpdateHeader]] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)  # partitions this node submitted a result for
    bytes_in: int = 0


class PartitionedExchange:
    """Plays the partitioned rounds of one node (see the module docstring)."""

    def __init__(
        self,
        trainer: NodeTrainer,
        node: P2PNode,
        client: CoordinatorClient,
        fetcher: MemberFetcher,
        *,
        withhold: bool = False,
    ) -> None:
        self.trainer = trainer
        self.node = node
        self.client = client
        self.fetcher = fetcher
        self.withhold = withhold  # testing aid: never publish a result (a backup takes over)
        self.verifier = PartitionVerifier(trainer, node, client)
        self.scores = PartitionScores(trainer, node, client, fetcher)
        self.last_bytes_in = 0
        # The last round's seconds per stage and bytes in per kind (the round report's).
        self.last_phases: dict[str, float] = {}
        self.last_bytes: dict[str, int] = {}

    async def play(self, info: RoundInfo) -> RoundOutcome:
        """Aggregate, back up, verify and assemble round ``info.round``; return the outcome."""
        me = self.trainer.peer
        state = _Round(info, state_numel(self.trainer.state))
        with trio.move_on_after(limits.HEADER_WAIT_S):
            await self.fetcher.finder.dial_listed(info.addrs)
        unreached = self._say_unreached(info)
        if len(unreached) == len(info.members) - 1 > 0 and not any(info.addrs.values()):
            # No member of the round, this node included, has an address the coordinator
            # accepted: nobody can ever connect to anybody, so nothing can be exchanged. Stop
            # now, naming them, rather than after a round of deadlines.
            raise UnreachableError(info.round, unreached)
        deadline_s = (info.collect_deadline_ms or 0) / 1000 - time.time()
        mine = [p for p, peer in enumerate(info.aggregators) if peer == me]
        fetch_until = trio.current_time() + max(deadline_s - limits.COLLECT_REPORT_MARGIN_S, 1.0)
        phases = self.last_phases = {}
        clock = Clock(phases)
        async with trio.open_nursery() as nursery:
            if self.scores.enabled:  # score this node's targets while the partitions fetch
                nursery.start_soon(clock.timed, "scores", self.scores.score_targets, info)
            for partition in mine:
                await self._aggregate(state, partition, backup_for=None, fetch_until=fetch_until)
            clock.lap("aggregate")  # its inputs fetched, the scores agreed, aggregated
        clock.lap("scores_wait")  # this node's own scoring, when it ends after its partition
        phases.update(self.scores.split_phases())  # "scores": fetching, then measuring
        recorded = await self._wait_results(state)
        clock.lap("results_wait")
        spread = await self.scores.agreed(info) if self.scores.enabled else None
        results = await self._open_results(state, recorded, _decided(info, spread))
        if spread is not None:  # a result that aggregates an update the scores left out
            for partition in [
                p for p, (_, r) in results.items() if set(r.inputs) - set(spread.inputs)
            ]:
                log.warning("partition_result_ignores_scores", partition=partition)
                del results[partition]  # applies nothing, on every node (the same records)
        # Fetch the outputs before reporting `checked`: the round is agreed once every member
        # has checked, and an aggregator whose last round it is may leave right after.
        try:
            state.bytes_in += (await self._fetch_outputs(recorded, results))[1]
        except OutputsUnavailableError as exc:
            log.warning("partition_outputs_not_yet", round=info.round, error=str(exc))
        clock.lap("results")
        verified = await self.verifier.check(info, recorded, results, numel=state.numel)
        clock.lap("verify")
        agreed = await self._wait_agreed(info.round)
        clock.lap("agreed_wait")
        outputs, got = await self._fetch_outputs(agreed, results)
        state.bytes_in += got
        dropped = dict(agreed.excluded)
        self.last_bytes = {
            "exchange": state.bytes_in,
            "verify": verified,
            "scores": self.scores.bytes_in,
        }
        self.last_bytes_in = sum(self.last_bytes.values())
        self.scores.bytes_in = 0
        outcome = await trio.to_thread.run_sync(
            lambda: self.trainer.apply_partitions(
                info.round, results, outputs, parts=info.parts, dropped=dropped, scores=spread
            )
        )
        clock.lap("assemble")
        unreached = self._say_unreached(info)
        others = [m for m in info.members if m != me]
        if outcome.empty and others and len(unreached) == len(others):
            # Nothing was exchanged, and this node reached nobody: it cannot take part (the
            # next round would be the same). Stop, naming whom and why (reason "unreachable").
            raise UnreachableError(info.round, unreached)
        return outcome

    def _say_unreached(self, info: RoundInfo) -> dict[str, str]:
        return self.fetcher.finder.say_unreached(info.round, info.members, info.addrs)

    # -- 1 and 2: aggregating a partition ---------------------------------------------------

    async def _aggregate(
        self, state: _Round, partition: int, *, backup_for: str | None, fetch_until: float
    ) -> None:
        """Fetch the partition's inputs until trio time ``fetch_until`` (an aggregator in a
        scored round: and until the score records close), then aggregate what came (a member
        whose slice did not is listed as missing), store, sign and report."""
        info, me = state.info, self.trainer.peer
        missing = await self._fetch_inputs(state, partition, backup_for, fetch_until)
        if me in info.headers and me not in state.headers:
            own = self._own_header(info)
            if own is not None:
                state.headers[me] = own
        inputs = {m: h for m, h in state.headers.items() if m not in missing}
        for member in info.members:
            if member not in inputs and member not in missing:
                missing[member] = state.invalid.get(member, "no update header recorded")
        spread = await self.scores.agreed(info) if self.scores.enabled else None
        if spread is not None:  # only what the agreed scores admit (specs: scores, partitioned)
            for member in sorted(set(inputs) - set(spread.inputs)):
                missing[member] = spread.left_out.get(member, "left out by scores")
                del inputs[member]
        if self.withhold:
            log.warning("partition_withheld", round=info.round, partition=partition)
            return
        decided = _decided(info, spread) - set(inputs)
        if not partition_quorum(len(inputs), len(decided), len(info.members)):
            # Cut off from most members: its own few updates would stand for the partition.
            # Publish nothing; a backup takes it over. (Rejected is not missing: see
            # cnode.aggregation.partition_quorum.)
            counts = {"inputs": len(inputs), "decided": len(decided), "members": len(info.members)}
            log.warning("partition_not_published", round=info.round, partition=partition, **counts)
            return
        envelope, _result = await trio.to_thread.run_sync(
            lambda: self.trainer.aggregate_partition(
                info.round,
                inputs,
                partition=partition,
                parts=info.parts,
                missing=missing,
                backup_for=backup_for,
            )
        )
        cid = partition_result_cid(envelope)
        self.node.store.put(cid, envelope)
        # No `hold` for the output: the result names its signer, whom every fetcher asks first
        # (fetch_outputs); a `hold` costs every member a check per mesh copy (issue 41).
        try:
            await self.client.result(info.round, partition=partition, header=str(cid))
        except CoordinatorRejected as exc:  # a backup came first, or the round was decided
            log.info("partition_result_refused", partition=partition, error=str(exc))
            return
        state.done.add(partition)
        log.info(
            "partition_aggregated",
            round=info.round,
            partition=partition,
            inputs=len(inputs),
            missing=len(missing),
            backup_for=None if backup_for is None else backup_for[-8:],
        )

    async def _fetch_inputs(
        self, state: _Round, partition: int, backup_for: str | None, fetch_until: float
    ) -> dict[str, str]:
        """Fetch ``partition``'s slices of every member's update until trio time
        ``fetch_until`` (an aggregator in a scored round: and until the score records close);
        return the members whose slice did not come, each with why."""
        info, me = state.info, self.trainer.peer
        indices = input_segments(state.numel, info.parts, partition)
        missing: dict[str, str] = {}

        async def fetch_all(done: trio.CancelScope) -> None:
            async with trio.open_nursery() as nursery:
                for member in info.members:
                    if member != me:
                        missing[member] = "no fetch finished in time"
                        nursery.start_soon(self._get_input, state, member, indices, missing)
            done.cancel()  # every input is in: stop waiting

        with trio.CancelScope() as fetching, fetch_purpose("segments"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetch_all, fetching)
                await trio.sleep_until(fetch_until)
                if self.scores.enabled and backup_for is None:
                    # The aggregator waits for the score records to close anyway: a member
                    # whose slice is still on its way is not left out while they are open
                    # (specs/coordinator.md#pace: a loaded machine delays, it does not decide).
                    await self.scores.agreed(info)
                fetching.cancel()
        return missing

    def _own_header(self, info: RoundInfo) -> tuple[CID, UpdateHeader] | None:
        cid = CID.parse(info.headers[self.trainer.peer])
        try:
            envelope = self.node.store.get(cid)
            return cid, open_update_header(envelope, run=self.trainer.run, round_=info.round)
        except (StorageError, PeerUpdateError):
            return None

    async def _get_input(
        self, state: _Round, member: str, indices: Sequence[int], missing: dict[str, str]
    ) -> None:
        """One member's header and the partition's segments of its update: first from the
        member, then from every member (FETCH_ATTEMPTS tries)."""
        info = state.info
        if member not in info.headers:
            missing[member] = "the round record lists no header for it"
            return

        async def attempt(i: int) -> None:
            holders = self.fetcher.holders_for(info, member, everyone=i > 0)
            if member not in state.headers:
                header = await self.fetcher.fetch_header(info, member, holders, state.invalid)
                if header is None:
                    missing[member] = state.invalid.get(member, "invalid update header")
                    return
                state.headers[member] = header
            _, header_ = state.headers[member]
            state.bytes_in += await fetch_update_segments(
                self.node, header_.update, indices, holders
            )
            missing.pop(member, None)

        def failed(_: int, why: str) -> None:
            missing[member] = f"update not fetched: {why}"

        n = self.fetcher.attempts_for(info, member)
        await with_retries(attempt, refused_by=self.fetcher.refused_by, failed=failed, attempts=n)

    # -- waiting for results, backups ---------------------------------------------------------

    async def _wait_results(self, state: _Round) -> RoundInfo:
        """Poll until every partition has a result (or the round is agreed), taking over a
        partition this node backs up when its time comes."""
        info = state.info
        current = info
        with trio.move_on_after(limits.RESULTS_WAIT_S):
            while True:
                # One long poll, held until every result is in or this node's next backup turn
                # (never cancelled and re-sent on a short timer: n nodes x 2 requests every
                # 2 s was most of a 16-node swarm's requests, issue 27).
                wait_s = self._until_my_backup(state, current)
                current = await self.client.round_info(info.round, wait_s=wait_s, until="results")
                if current.agreed is not None or len(current.results) >= info.parts:
                    return current
                await self._back_up(state, current)
        raise RoundStalledError(
            f"round {info.round}: partition results still missing after {limits.RESULTS_WAIT_S:g} s"
        )

    def _until_my_backup(self, state: _Round, current: RoundInfo) -> float:
        """Seconds to hold the next results poll: until this node's earliest backup turn for a
        partition still without a result (at least BACKUP_POLL_MIN_S); the longest poll when it
        has none; BACKUP_POLL_MIN_S x 2 while the result window is not open (its opening is
        not a result, so a poll would not answer on it)."""
        info, me = state.info, self.trainer.peer
        if current.results_open_ms is None or current.backup_step_ms is None:
            return limits.BACKUP_POLL_MIN_S * 2
        opened, step = current.results_open_ms / 1000, current.backup_step_ms / 1000
        turns = [
            opened + (order.index(me) + 1) * step
            for partition in range(info.parts)
            if str(partition) not in current.results and partition not in state.done
            for order in [backup_aggregators(self.trainer.run, info.round, info.members, partition)]
            if me in order
        ]
        if not turns:
            return coordinator_limits.MAX_LONG_POLL_S
        wait = min(turns) - time.time()
        return min(max(wait, limits.BACKUP_POLL_MIN_S), coordinator_limits.MAX_LONG_POLL_S)

    async def _back_up(self, state: _Round, current: RoundInfo) -> None:
        """Take over a partition this node backs up once its time in the result window came
        (the window and its step are the coordinator's, measured on the round: backup k from
        ``results_open + (k + 1) x backup_step``)."""
        info, me = state.info, self.trainer.peer
        if current.results_open_ms is None or current.backup_step_ms is None:
            return  # the window has not opened: the aggregators still have the scores to wait for
        opened, step = current.results_open_ms / 1000, current.backup_step_ms / 1000
        now = time.time()
        for partition in range(info.parts):
            if str(partition) in current.results or partition in state.done:
                continue
            order = backup_aggregators(self.trainer.run, info.round, info.members, partition)
            if me not in order:
                continue
            k = order.index(me)
            if now >= opened + (k + 1) * step:
                log.info("partition_backup", partition=partition, k=k, step_s=step)
                state.done.add(partition)
                # Its turn lasts one step: fetch for half of it, then aggregate what came.
                await self._aggregate(
                    state,
                    partition,
                    backup_for=info.aggregators[partition],
                    fetch_until=trio.current_time() + step / 2,
                )

    # -- 3: verification ----------------------------------------------------------------------

    async def _open_results(
        self, state: _Round, recorded: RoundInfo, decided: set[str]
    ) -> dict[int, tuple[CID, PartitionResult]]:
        """Fetch and open every recorded result. One whose bytes are not a valid result of the
        partition, or that misses the partition quorum (``decided``: the members left out on
        agreed evidence), applies nothing (the same bytes, the same verdict, on every node);
        one this node cannot fetch raises OutputsUnavailableError (it must not apply another
        set)."""
        out: dict[int, tuple[CID, PartitionResult]] = {}
        for key, entry in sorted(recorded.results.items(), key=lambda kv: int(kv[0])):
            partition, cid = int(key), CID.parse(entry.header)
            holders = [entry.peer] + [m for m in state.info.members if m != entry.peer]

            async def attempt(_: int, cid: CID = cid, holders: list[str] = holders) -> None:
                with fetch_purpose("results"):  # nothing is asked for when it is held
                    await self.node.fetch_blocks([cid], holders=holders)

            got = await with_retries(attempt, refused_by=self.fetcher.refused_by)
            if isinstance(got, GaveUp):
                raise OutputsUnavailableError(
                    f"round {state.info.round}: the result of partition {partition} could not "
                    f"be fetched: {got.why}"
                )
            try:
                result = open_partition_result(
                    self.node.store.get(cid),
                    run=self.trainer.run,
                    round_=state.info.round,
                    signer=entry.peer,
                )
            except (StorageError, PeerUpdateError) as exc:
                log.warning("partition_result_unusable", partition=partition, error=str(exc))
                continue
            if result.partition != partition or result.parts != state.info.parts:
                log.warning("partition_result_mislabelled", partition=partition)
                continue
            others = len(decided - set(result.inputs))
            if not partition_quorum(len(result.inputs), others, len(state.info.members)):
                log.warning("partition_result_too_few_inputs", partition=partition)
                continue
            out[partition] = (cid, result)
        bases = [r.base for _, r in out.values()]
        if bases and 2 * sum(b != self.trainer.state_cid for b in bases) > len(bases):
            raise StateMismatchError(
                f"round {state.info.round}: most partition results were aggregated on another "
                f"state than this node's {self.trainer.state_cid}"
            )
        return out

    # -- 4: assembling ------------------------------------------------------------------------

    async def _wait_agreed(self, round_: int) -> RoundInfo:
        agreed: RoundInfo | None = None
        with trio.move_on_after(limits.RESULTS_WAIT_S):
            agreed = await self.client.wait_agreed(round_)
        if agreed is None or agreed.agreed is None:
            raise RoundStalledError(f"round {round_}: not agreed {limits.RESULTS_WAIT_S:g} s on")
        return agreed

    async def _fetch_outputs(
        self, agreed: RoundInfo, results: dict[int, tuple[CID, PartitionResult]]
    ) -> tuple[dict[int, CID | None], int]:
        return await fetch_outputs(self.node, self.fetcher, self.trainer.peer, agreed, results)


def _decided(info: RoundInfo, spread: SpreadScores | None) -> set[str]:
    """The members out of round ``info`` on agreed evidence, the same on every node (what
    ``partition_quorum`` counts as decided): left out by the agreed scores (their ``left_out``
    names the members without a recorded header too), or, without scores, no header recorded."""
    return set(spread.left_out) if spread else {m for m in info.members if m not in info.headers}
