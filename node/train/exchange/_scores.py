"""Scores of a partitioned round, on the network: score the assigned targets, agree on all.

specs/training.md#scores-in-partitioned-rounds, message by message:

1. **Score.** As soon as the round is published, this node fetches the whole updates of its
   targets (``targets_of``: the next SCORERS_PER_UPDATE members in the assignment order), every
   block verified, measures their losses exactly as a full round does, all targets together
   (``RoundScoring.measure_targets``: their "before" losses share one forward pass),
   signs a :class:`ScoreRecord`, stores it as a block and reports its CID (op ``score``). It
   always reports one, naming the targets it could not score and why.
2. **Close.** The coordinator takes records until every member sent one or the score deadline;
   then ``scores_closed`` is set and every node reads the same set of record CIDs.
3. **Agree.** Every node fetches and opens those records, recomputes any disputed target itself
   (fetching its whole update) and runs ``resolve_scores``: the same scores, admitted set,
   reputations and wrong-score evidence everywhere. Aggregators aggregate only ``inputs``;
   every node assembles with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog
import trio

from cnode.aggregation import score_seed, validate_update
from cnode.node.coordinator import CoordinatorClient, CoordinatorRejected, RoundInfo
from cnode.node.p2p import P2PNode, fetch_purpose
from cnode.storage import CID

from .. import limits
from .._exceptions import (
    MalformedUpdateError,
    OutputsUnavailableError,
    PeerUpdateError,
    RoundStalledError,
)
from .._round import UpdateHeader, expected_specs, load_update
from .._trainer import NodeTrainer
from ..model import State
from ..scores import (
    INVALID_PREFIX,
    BadScoreRecordError,
    ScoreRecord,
    SpreadRecords,
    SpreadScores,
    TargetLosses,
    disputed_targets,
    open_score_record,
    resolve_scores,
    score_record_cid,
    seal_score_record,
    targets_of,
)
from ._fetch import GaveUp, MemberFetcher, with_retries

__all__ = ["PartitionScores", "round_headers"]

log = structlog.get_logger(__name__)


def round_headers(info: RoundInfo) -> dict[str, str]:
    """The members' header CIDs the round record lists: the score seed's input."""
    return {m: c for m, c in sorted(info.headers.items()) if m in info.members}


# The losses the score-record testing aids sign (``--attack``, node/train/_loop.py NODE_ATTACKS).
_AID_LOSSES = {
    "extreme_scores": (5.0, -1e308, 5.0, 4.9),  # issue 29: finite, out of range
    "zero_scores": (0.0, 0.0, 0.0, 0.0),  # in range: a loss of 0 on both sides
}


def _testing_aid(
    attack: str | None, info: RoundInfo, targets: list[str], scores: dict[str, TargetLosses]
) -> dict[str, TargetLosses]:
    """The aid's losses for every target the round lists a header of, fetched or not (so the
    record it signs does not depend on how fast the fetches were)."""
    losses = _AID_LOSSES.get(attack or "")
    if losses is None:
        return scores
    return {
        t: TargetLosses(CID.parse(info.headers[t]), *losses) for t in targets if t in info.headers
    }


class PartitionScores:
    """Scoring of one node's partitioned rounds (see the module docstring)."""

    def __init__(
        self,
        trainer: NodeTrainer,
        node: P2PNode,
        client: CoordinatorClient,
        fetcher: MemberFetcher,
    ) -> None:
        self.trainer = trainer
        self.node = node
        self.client = client
        self.fetcher = fetcher
        self._agreed: dict[int, SpreadScores] = {}
        # One measurement at a time: RoundScoring holds one model, loaded per measurement.
        self._model_lock = trio.CapacityLimiter(1)
        self.bytes_in = 0  # whole updates and records fetched for scoring (this node's share)
        # The last round's seconds fetching the targets and measuring them (the round report's
        # phases ``scores_fetch`` and ``scores_compute``: bench/capped_round.py tells them apart).
        self.last_fetch_s = self.last_compute_s = 0.0

    @property
    def enabled(self) -> bool:
        return self.trainer.scoring is not None

    def split_phases(self) -> dict[str, float]:
        """The last round's ``scores_fetch`` and ``scores_compute`` seconds (none unscored)."""
        if not self.enabled:
            return {}
        return {
            "scores_fetch": round(self.last_fetch_s, 4),
            "scores_compute": round(self.last_compute_s, 4),
        }

    # -- 1: scoring this node's targets ---------------------------------------------------------

    async def score_targets(self, info: RoundInfo) -> None:
        """Measure this node's targets, sign, store and report the record (op ``score``)."""
        me, scoring = self.trainer.peer, self.trainer.scoring
        self.last_fetch_s = self.last_compute_s = 0.0
        if scoring is None or me not in info.members:
            return
        seed = score_seed(round_headers(info).values())
        targets = targets_of(self.trainer.run, info.round, info.members, me)
        fetched: dict[str, tuple[CID, UpdateHeader]] = {}
        unscored: dict[str, str] = {t: "not fetched in time" for t in targets}
        began = trio.current_time()
        with trio.move_on_after(limits.ROUND_FETCH_S):
            async with trio.open_nursery() as nursery:
                for target in targets:
                    nursery.start_soon(self._fetch_target, info, target, fetched, unscored)
        measuring = trio.current_time()
        self.last_fetch_s = measuring - began
        # Then every fetched target in one measurement: their "before" losses share one pass.
        scores = await trio.to_thread.run_sync(
            self._measure_targets, info.round, seed, fetched, unscored, limiter=self._model_lock
        )
        self.last_compute_s = trio.current_time() - measuring
        scores = _testing_aid(self.trainer.attack_name, info, targets, scores)
        record = ScoreRecord(
            self.trainer.run,
            info.round,
            me,
            self.trainer.state_cid,
            seed,
            scores,
            {t: why for t, why in unscored.items() if t not in scores},
        )
        envelope = seal_score_record(self.trainer.identity, record)
        cid = score_record_cid(envelope)
        self.node.store.put(cid, envelope)
        try:
            await self.client.score(info.round, record=envelope)
        except CoordinatorRejected as exc:  # too late (closed), or already sent
            log.warning("score_record_refused", round=info.round, error=str(exc))
            return
        log.info(
            "scores_reported",
            round=info.round,
            scored=len(scores),
            unscored=len(record.unscored),
            seconds=round(trio.current_time() - began, 3),
        )

    async def _fetch_target(
        self,
        info: RoundInfo,
        target: str,
        fetched: dict[str, tuple[CID, UpdateHeader]],
        unscored: dict[str, str],
    ) -> None:
        if target not in info.headers:
            unscored[target] = "the round record lists no header for it"
            return
        got = await self._fetch_update(info, target)
        if isinstance(got, str):
            unscored[target] = got
        else:
            fetched[target] = got

    async def _fetch_update(self, info: RoundInfo, target: str) -> tuple[CID, UpdateHeader] | str:
        """The target's header and whole update (blocks verified), or why not."""

        async def attempt(i: int) -> tuple[CID, UpdateHeader] | str:
            holders = self.fetcher.holders_for(info, target, everyone=i > 0)
            with fetch_purpose("scores"):
                got = await self.fetcher.fetch_header(info, target, holders)
                if got is None:
                    return INVALID_PREFIX + "its update header does not open"
                self.bytes_in += (await self.node.fetch(got[1].update, holders=holders)).bytes
            return got

        got = await with_retries(
            attempt,
            refused_by=self.fetcher.refused_by,
            attempts=self.fetcher.attempts_for(info, target),
        )
        if isinstance(got, GaveUp):
            return f"update not fetched: {got.why}"[: limits.MAX_REASON_CHARS]
        return got

    def _load(self, target: str, header: UpdateHeader) -> State | str:
        """The target's update, decoded and validated against the agreed state, or why not."""
        trainer = self.trainer
        if header.base != trainer.state_cid:
            return f"trained from state {header.base}, not {trainer.state_cid}"
        try:
            update = load_update(
                trainer.store,
                header.update,
                peer=target,
                codec=trainer.config.wire_codec,
                shapes=trainer.state,
            )
        except (MalformedUpdateError, PeerUpdateError) as exc:
            return (INVALID_PREFIX + exc.reason)[: limits.MAX_REASON_CHARS]
        bad = validate_update(update, expected_specs(trainer.state))
        if bad is not None:
            return (INVALID_PREFIX + bad)[: limits.MAX_REASON_CHARS]
        return update

    def _measure_targets(
        self,
        round_: int,
        seed: bytes,
        fetched: Mapping[str, tuple[CID, UpdateHeader]],
        unscored: dict[str, str],
    ) -> dict[str, TargetLosses]:
        """The losses of every fetched target that loads (``RoundScoring.measure_targets``);
        each one that does not is added to ``unscored`` with why."""
        scoring = self.trainer.scoring
        assert scoring is not None
        updates: dict[str, State] = {}
        for target, (_cid, header) in sorted(fetched.items()):
            got = self._load(target, header)
            if isinstance(got, str):
                unscored[target] = got
            else:
                updates[target] = got
        measured = scoring.measure_targets(round_, seed, self.trainer.state, updates)
        return {t: TargetLosses.measured(fetched[t][0], losses) for t, losses in measured.items()}

    def _measure(
        self, round_: int, seed: bytes, target: str, cid: CID, header: UpdateHeader
    ) -> TargetLosses | str:
        """One target's losses (a disputed one, recomputed), or why it cannot be scored."""
        scoring = self.trainer.scoring
        assert scoring is not None
        update = self._load(target, header)
        if isinstance(update, str):
            return update
        return TargetLosses.measured(
            cid, scoring.measure(round_, seed, self.trainer.state, target, update)
        )

    # -- 2 and 3: the closed records, agreed ----------------------------------------------------

    async def agreed(self, info: RoundInfo) -> SpreadScores:
        """The round's agreed scores (computed once per round; every node gets the same)."""
        if info.round in self._agreed:
            return self._agreed[info.round]
        scoring = self.trainer.scoring
        assert scoring is not None
        closed = await self._wait_closed(info)
        # The coordinator serves every record's bytes: one whose scorer serves nothing is still
        # the same for everyone. The signed round record names each one's CID.
        served = await self.client.score_records(info.round)
        records: dict[str, tuple[CID, ScoreRecord]] = {}
        refused: dict[str, tuple[CID, str]] = {}
        for scorer, text in sorted(closed.scores.items()):
            if scorer not in closed.members:
                continue
            cid = CID.parse(text)
            data = served.get(scorer, b"")
            if score_record_cid(data) != cid:
                raise OutputsUnavailableError(
                    f"round {info.round}: the coordinator served no record {cid} of {scorer}"
                )
            self.node.store.put(cid, data)
            try:
                records[scorer] = (
                    cid,
                    open_score_record(
                        self.node.store.get(cid), run=self.trainer.run, round_=info.round,
                        signer=scorer,
                    ),
                )  # fmt: skip
            except BadScoreRecordError as exc:  # signed, and not a record: its signer is named
                log.warning("score_record_bad", scorer=scorer[-8:], error=exc.reason)
                refused[scorer] = (cid, exc.reason)
            except PeerUpdateError as exc:  # the same bytes give the same verdict everywhere
                log.warning("score_record_unusable", scorer=scorer[-8:], error=exc.reason)
        headers = {m: CID.parse(c) for m, c in round_headers(closed).items()}
        for member in sorted(headers):  # the checkpoint lists those that open: hold them
            await self._fetch_header(closed, member)
        seed = score_seed(str(c) for c in headers.values())
        # The members are those with a header: what a replay sees in the checkpoint.
        common = SpreadRecords(
            run=self.trainer.run, round_=info.round, members=sorted(headers), headers=headers,
            base=self.trainer.state_cid, seed=seed, records=records,
        )  # fmt: skip
        recomputed: dict[str, TargetLosses] = {}
        for target in disputed_targets(common):
            log.warning("score_disputed", round=info.round, target=target[-8:])
            got = await self._fetch_update(closed, target)
            if isinstance(got, str):
                raise OutputsUnavailableError(
                    f"round {info.round}: the disputed update of {target} cannot be had: {got}"
                )
            losses = await trio.to_thread.run_sync(
                self._measure, info.round, seed, target, *got, limiter=self._model_lock
            )
            if isinstance(losses, str):
                raise OutputsUnavailableError(
                    f"round {info.round}: the disputed update of {target} cannot be scored: "
                    f"{losses}"
                )
            recomputed[target] = losses
        resolved = resolve_scores(
            common,
            reputation=scoring.reputation,
            recompute=recomputed.__getitem__,
            refused=refused,
        )
        self._agreed = {info.round: resolved}  # only the current round is ever asked again
        log.info(
            "scores_agreed",
            round=info.round,
            records=len(records),
            scored=len(resolved.scores),
            left_out=len(resolved.left_out),
            wrong=len(resolved.wrong),
        )
        return resolved

    async def _wait_closed(self, info: RoundInfo) -> RoundInfo:
        with trio.move_on_after(limits.SCORES_WAIT_S):
            # One long poll, answered when the records close: re-reading the record every
            # POLL_INTERVAL_S made n x (phase length / 0.2 s) requests (issue 27).
            return await self.client.wait_scores_closed(info.round)
        raise RoundStalledError(
            f"round {info.round}: score records not closed after {limits.SCORES_WAIT_S:g} s"
        )

    async def _fetch_header(self, info: RoundInfo, member: str) -> None:
        """A member's header block, when it can be had (gossip brought it to most nodes
        already). One that cannot is only not listed: its update has no score anyway (its
        scorers could not fetch it either), so it is left out on every node alike."""

        async def attempt(_: int) -> None:
            holders = self.fetcher.holders_for(info, member, everyone=True)
            with fetch_purpose("scores"):
                await self.fetcher.fetch_header(info, member, holders)  # stored, even if invalid

        got = await with_retries(attempt, refused_by=self.fetcher.refused_by)
        if isinstance(got, GaveUp):
            log.warning("score_header_unavailable", member=member[-8:], error=got.why)
