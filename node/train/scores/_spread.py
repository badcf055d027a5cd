"""Scores spread over the members of a partitioned round: who scores whom, and the agreed scores.

specs/training.md#scores-in-partitioned-rounds. Pure functions of the round record, the signed
score records the coordinator closed, and a ``recompute`` callable for disputed targets, so every
node, every verifier and ``verify --replay`` reach the same scores, the same admitted set and the
same reputations.

* **Assignment.** The round's members in the partition assignment order (``assign_partitions``
  over all members); each scores the next ``SCORERS_PER_UPDATE`` (``score_assignment``).
* **Claims.** A target's claims are the losses its assigned scorers signed for the header CID
  the round record lists, on the round's parent state and seed. Other entries are ignored.
* **Agreement.** No claim: the target is *unscored* and left out of the aggregate (an update must
  be scored to enter; a sender that serves its update to aggregators but not to scorers gains
  nothing). Claims that give the same integer (own, held) scores: agreed, the first scorer's
  losses recorded. Claims that differ: a **dispute**: the target is recomputed (``recompute``,
  the same code a scorer runs) and the recomputation is the score; every scorer whose claim gives
  other integers signed a wrong score: self-proving ban evidence (its record CID, the target's
  header CID, seed, base, claimed and recomputed losses).
* **Bad records.** A closed record whose signature verifies but whose content does not decode
  (a loss out of range, say: ``BadScoreRecordError``) says nothing about any target, like a
  missing one, and its scorer is named: self-proving ban evidence (the record's CID; anyone who
  holds the bytes opens them and sees the same refusal).
* **Admission** as in a full round: the round decision's ``admission`` moves reputations by the
  agreed scores and picks the inputs; an update the scorers found invalid (non-finite, wrong
  shape) is still passed to the aggregators, which reject it with the reason (ban evidence as
  before).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cnode.aggregation import (
    Admission,
    BanRecommendation,
    EvidenceKind,
    UpdateScore,
    admission,
    assign_partitions,
    score_assignment,
)
from cnode.storage import CID

from .. import limits
from ._records import ScoreRecord, TargetLosses

__all__ = [
    "BAD_RECORD_REASON",
    "INVALID_PREFIX",
    "SpreadRecords",
    "SpreadScores",
    "disputed_targets",
    "resolve_scores",
    "scorers_of",
    "targets_of",
]

# An unscored reason that starts so says the scorer found the update itself invalid.
INVALID_PREFIX = "invalid update: "
# How the ban evidence against a scorer whose signed record does not decode is worded (the
# coordinator checks such a report itself: node/coordinator/_bans/_reputation.py).
BAD_RECORD_REASON = "signed a score record that does not decode: "


@dataclass(frozen=True)
class SpreadRecords:
    """What every node agrees a partitioned round's scores come from: the run and round, its
    members and their header CIDs as the round record listed them, the state scored from, the
    seed, and the closed score records (scorer -> (record CID, opened record))."""

    run: str
    round_: int
    members: Sequence[str]
    headers: Mapping[str, CID]
    base: CID
    seed: bytes
    records: Mapping[str, tuple[CID, ScoreRecord]]


def _assignment(run: str, round_: int, members: Sequence[str]) -> dict[str, list[str]]:
    order = assign_partitions(run, round_, sorted(members), len(members))
    return score_assignment(order, limits.SCORERS_PER_UPDATE)


def targets_of(run: str, round_: int, members: Sequence[str], scorer: str) -> list[str]:
    """The members whose updates ``scorer`` scores in this round (none when not a member)."""
    if len(members) < 2:
        return []
    return _assignment(run, round_, members).get(scorer, [])


def scorers_of(run: str, round_: int, members: Sequence[str]) -> dict[str, list[str]]:
    """target -> its scorers, in assignment order (every member has the same number)."""
    out: dict[str, list[str]] = {m: [] for m in members}
    if len(members) < 2:
        return out
    for scorer, targets in _assignment(run, round_, members).items():
        for target in targets:
            out[target].append(scorer)
    return out


@dataclass(frozen=True)
class SpreadScores:
    """What the closed score records of one round decide."""

    seed: bytes
    scores: dict[str, UpdateScore]  # target -> its agreed score
    losses: dict[str, TargetLosses]  # target -> the losses behind it
    reputation: dict[str, int]  # after this round (every peer ever scored)
    admitted: tuple[str, ...]  # scored and admitted (sorted)
    inputs: tuple[str, ...]  # what aggregators aggregate: admitted + found invalid (sorted)
    left_out: dict[str, str]  # member -> why the scores keep it out of the aggregate
    records: dict[str, CID]  # scorer -> its record's CID (those the round closed with)
    headers: dict[str, CID]  # member -> its update header CID: what the seed is taken over
    wrong: tuple[BanRecommendation, ...]  # scorers of a disputed target that signed other scores
    decision: Admission  # the round decision's admission (standings, reputation, left out)

    def to_params(self) -> dict[str, Any]:
        """The round's ``params["scores"]``: as a full round's, plus the records' and the
        members' header CIDs."""

        def text(x: float) -> float | str:
            return x if x == x and abs(x) != float("inf") else repr(x)

        return {
            "seed": self.seed.hex(),
            "peers": {
                p: [
                    *(text(v) for v in (s.own_before, s.own_after, s.held_before, s.held_after)),
                    s.own,
                    s.held,
                    s.score,
                ]
                for p, s in sorted(self.scores.items())
            },
            "admitted": list(self.admitted),
            "reputation": dict(sorted(self.reputation.items())),
            "records": {p: str(c) for p, c in sorted(self.records.items())},
            # The seed's input: every member's header CID as the round record listed it (a
            # header that does not open is not among the checkpoint's signed records).
            "headers": {p: str(c) for p, c in sorted(self.headers.items())},
        }


def _claims(s: SpreadRecords) -> dict[str, tuple[list[tuple[str, TargetLosses]], list[str]]]:
    """target -> (claims of its assigned scorers, their unscored reasons), in scorer order."""
    round_, headers, base, seed, records = s.round_, s.headers, s.base, s.seed, s.records
    out: dict[str, tuple[list[tuple[str, TargetLosses]], list[str]]] = {}
    for target, scorers in sorted(scorers_of(s.run, round_, s.members).items()):
        header = headers.get(target)
        claims: list[tuple[str, TargetLosses]] = []
        reasons: list[str] = []
        for scorer in scorers:
            entry = records.get(scorer)
            if entry is None or entry[1].base != base or entry[1].seed != seed:
                continue  # no record, or one of another state or seed: says nothing here
            record = entry[1]
            if target in record.scores and record.scores[target].header == header:
                claims.append((scorer, record.scores[target]))
            elif target in record.unscored:
                reasons.append(record.unscored[target])
        out[target] = (claims, reasons)
    return out


def _ints(target: str, losses: TargetLosses) -> tuple[int, int]:
    s = losses.score(target)
    return s.own, s.held


def disputed_targets(s: SpreadRecords) -> list[str]:
    """The targets whose scorers' claims give different integer scores (sorted): each must be
    recomputed before :func:`resolve_scores`."""
    claims = _claims(s)
    return [t for t, (c, _) in claims.items() if len({_ints(t, x) for _, x in c}) > 1]


def resolve_scores(
    s: SpreadRecords,
    *,
    reputation: Mapping[str, int],
    recompute: Callable[[str], TargetLosses],
    refused: Mapping[str, tuple[CID, str]] | None = None,
) -> SpreadScores:
    """Agree the round's scores from its closed records (see the module docstring).

    ``records``: scorer -> (record CID, opened record), the records the coordinator closed the
    round with that opened; ``reputation``: before this round; ``recompute(target)``: the
    recomputed losses of each of :func:`disputed_targets` (the caller fetched those updates:
    one it cannot have must stop it, not make it decide another set than the other nodes);
    ``refused``: scorer -> (record CID, why) of the closed records whose signature verified and
    whose content did not decode (:class:`BadScoreRecordError`): each is named in ``wrong``.
    """
    round_, headers, base, seed, records = s.round_, s.headers, s.base, s.seed, s.records
    scores: dict[str, UpdateScore] = {}
    losses: dict[str, TargetLosses] = {}
    left_out: dict[str, str] = {}
    invalid: list[str] = []
    wrong = [
        bad_record(round_, scorer, cid, why)
        for scorer, (cid, why) in sorted((refused or {}).items())
    ]
    claimed = _claims(s)
    for target, (claims, reasons) in claimed.items():
        if target not in headers:
            left_out[target] = "no update header recorded"
            continue
        if not claims:
            if reasons and all(r.startswith(INVALID_PREFIX) for r in reasons):
                invalid.append(target)  # the aggregators reject it with the reason
            else:
                left_out[target] = "not scored: no assigned scorer's record scores it"
            continue
        chosen = claims[0][1]
        if len({_ints(target, c) for _, c in claims}) > 1:
            chosen = recompute(target)
            right = _ints(target, chosen)
            for scorer, claim in claims:
                if _ints(target, claim) != right:
                    wrong.append(_wrong_score(round_, scorer, records[scorer][0], target, seed,
                                              base, claim, chosen))  # fmt: skip
        losses[target] = chosen
        scores[target] = chosen.score(target)
    decided = admission(scores, reputation)
    left_out.update(decided.left_out)
    return SpreadScores(
        seed,
        scores,
        losses,
        decided.reputation,
        decided.admitted,
        tuple(sorted([*decided.admitted, *invalid])),
        left_out,
        {p: c for p, (c, _) in sorted(records.items())},
        dict(headers),
        tuple(wrong),
        decided,
    )


def bad_record(round_: int, scorer: str, record: CID, why: str) -> BanRecommendation:
    """Ban evidence against a scorer whose signed record of ``round_`` does not decode."""
    return BanRecommendation(
        scorer,
        round_,
        EvidenceKind.BAD_SCORE_RECORD,
        (BAD_RECORD_REASON + why)[:200],
        str(record),  # the offending signed statement: the coordinator holds its bytes
        {"score_record": str(record)},
    )


def _wrong_score(
    round_: int,
    scorer: str,
    record: CID,
    target: str,
    seed: bytes,
    base: CID,
    claim: TargetLosses,
    right: TargetLosses,
) -> BanRecommendation:
    got, want = claim.score(target), right.score(target)
    return BanRecommendation(
        scorer,
        round_,
        EvidenceKind.WRONG_SCORE,
        f"signed a wrong score of {target[-8:]}: own {got.own} held {got.held}, "
        f"recomputed own {want.own} held {want.held}",
        str(record),  # the offending signed statement is the score record
        {
            "score_record": str(record),
            "target": target,
            "target_header": str(claim.header),
            "seed": seed.hex(),
            "base": str(base),
            "claimed": claim.to_payload()[1:],
            "recomputed": right.to_payload()[1:],
        },
    )
