"""The coordinator's own check of reputation-ban evidence (specs/coordinator.md#bans).

A reputation ban report names K = REPUTATION_BAN_ROUNDS consecutive scored rounds in which the
accused's reputation stayed below the ban bound and its own-data score below the own floor.
Reputations are integer functions of the agreed
scores, and in partitioned rounds the agreed scores are functions of the signed score records
the coordinator closed each round with. So the coordinator replays rounds 1..N with the same
code every node runs (``resolve_scores``) on the records it holds, no model needed, and compares
the accused's rounds, reputations, bounds, update CIDs, seeds and losses with the report.

A report that a scorer signed a record that does not decode (``BAD_RECORD_REASON``, figures
``{"score_record": CID}``) is checked on that one record: the coordinator passes the round's
record of the accused, and the evidence is correct iff its CID is the one named, its signature
is the accused's and its content does not decode (``BadScoreRecordError``), as on every node.

It decides only where the records alone decide: a round whose scorers disagree (a dispute is
settled by recomputing losses, which needs the model), or a record made on another seed than
the one of every listed header (a header that did not open: the nodes' seed is over fewer
headers), leaves the report undecided and the coordinator falls back to the majority rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cnode.aggregation import ban_bound, score_seed
from cnode.aggregation import limits as agg_limits
from cnode.node.coordinator import ReputationVerdict
from cnode.storage import CID, StorageError

from .._exceptions import PeerUpdateError
from ._records import (
    BadScoreRecordError,
    ScoreRecord,
    TargetLosses,
    open_score_record,
    score_record_cid,
)
from ._spread import SpreadRecords, disputed_targets, resolve_scores

__all__ = ["check_reputation_evidence"]


@dataclass(frozen=True)
class _Low:
    reputation: int
    bound: int
    update_cid: str
    seed: str
    score: dict[str, Any]


def _undecided(why: str) -> ReputationVerdict:
    return ReputationVerdict(False, False, why)


def _refuted(why: str) -> ReputationVerdict:
    return ReputationVerdict(True, False, why)


class _Undecidable(Exception):
    pass


def _records(run: str, n: int, data: Mapping[str, bytes]) -> dict[str, tuple[CID, ScoreRecord]]:
    out: dict[str, tuple[CID, ScoreRecord]] = {}
    for scorer, envelope in sorted(data.items()):
        try:
            out[scorer] = (
                score_record_cid(envelope),
                open_score_record(envelope, run=run, round_=n, signer=scorer),
            )
        except PeerUpdateError:
            continue  # the nodes skip a record that does not open, the same bytes everywhere
    return out


def _no_recompute(target: str) -> TargetLosses:
    raise _Undecidable(target)


def _replay(
    run: str, accused: str, rounds: Sequence[tuple[int, Mapping[str, str], Mapping[str, bytes]]]
) -> dict[int, _Low | None]:
    """Round -> the accused's figures in each round it was scored (None: at or above the bound)."""
    reputation: dict[str, int] = {}
    out: dict[int, _Low | None] = {}
    for n, header_text, data in rounds:
        if len(header_text) < 2:
            continue  # nobody scores anybody: reputations stay
        try:
            headers = {m: CID.parse(c) for m, c in sorted(header_text.items())}
        except StorageError as exc:
            raise _Undecidable(f"round {n}: a listed header CID does not parse: {exc}") from exc
        seed = score_seed(str(c) for c in headers.values())
        records = _records(run, n, data)
        if any(r.seed != seed for _, r in records.values()):
            raise _Undecidable(
                f"round {n}: a score record was made on another seed than the listed headers' "
                "(a header may not have opened)"
            )
        bases = {r.base for _, r in records.values()}
        if len(bases) > 1:
            raise _Undecidable(f"round {n}: the score records name {len(bases)} parent states")
        if not bases:
            continue
        common = SpreadRecords(
            run=run, round_=n, members=sorted(headers), headers=headers,
            base=bases.pop(), seed=seed, records=records,
        )  # fmt: skip
        if disputed_targets(common):
            raise _Undecidable(f"round {n}: a disputed score (settling it needs the model)")
        resolved = resolve_scores(common, reputation=reputation, recompute=_no_recompute)
        reputation = resolved.reputation
        if accused not in resolved.scores:
            continue
        rep = reputation[accused]
        bound = ban_bound({p: reputation[p] for p in resolved.scores})
        score = resolved.scores[accused].to_dict()
        # A round counts only with the reputation below the bound and the own score below the
        # own floor, as ReputationPolicy.observe counts it on every node: the round decision's
        # own standing (cnode.aggregation.admission), not a second computation of it.
        low = rep < bound and resolved.decision.standing[accused].harm
        out[n] = _Low(rep, bound, str(headers[accused]), seed.hex(), score) if low else None
    return out


def check_reputation_evidence(
    rounds: Sequence[tuple[int, Mapping[str, str], Mapping[str, bytes]]],
    *,
    run: str,
    accused: str,
    round_: int,
    figures: str,
) -> ReputationVerdict:
    """Replay ``rounds`` (every round 1..``round_``, ascending: (round, member -> listed header
    CID, scorer -> the signed score record bytes the round closed with)) and compare the
    accused's last REPUTATION_BAN_ROUNDS scored rounds with ``figures`` (the report's JSON).
    Figures that name only a ``score_record`` are a bad-record report: see the module docstring
    (``rounds`` may then hold round ``round_`` alone)."""
    try:
        claimed = json.loads(figures)
    except (ValueError, RecursionError) as exc:
        return _refuted(f"figures are not JSON: {str(exc)[:200]}")
    if not isinstance(claimed, dict):
        return _refuted("figures must be a JSON object")
    if set(claimed) == {"score_record"}:
        return _check_bad_record(rounds, run=run, accused=accused, round_=round_, cid=claimed)
    try:
        trail = _replay(run, accused, rounds)
    except _Undecidable as exc:
        return _undecided(str(exc))
    k = agg_limits.REPUTATION_BAN_ROUNDS
    scored = sorted(trail)
    if not scored or scored[-1] != round_:
        return _refuted(f"the records do not score {accused[-8:]} in round {round_}")
    last = scored[-k:]
    if claimed.get("rounds") != last:
        return _refuted(
            f"rounds {claimed.get('rounds')!r}: the accused's last {k} scored rounds are {last}"
        )
    highs = [n for n in last if trail[n] is None]
    if len(last) < k or highs:
        return _refuted(
            f"the records put the reputation at or above the ban bound, or the own score at or "
            f"above the own floor, in rounds {highs} "
            f"(of {last})"
        )
    lows = [trail[n] for n in last]
    want = {
        "reputations": [x.reputation for x in lows if x],
        "bounds": [x.bound for x in lows if x],
        "update_cids": [x.update_cid for x in lows if x],
        "seeds": [x.seed for x in lows if x],
        "scores": [x.score for x in lows if x],
    }
    for key, value in want.items():
        if claimed.get(key) != value:
            return _refuted(f"{key} {str(claimed.get(key))[:200]!r}: the records give {value!r}")
    return ReputationVerdict(True, True, "")


def _check_bad_record(
    rounds: Sequence[tuple[int, Mapping[str, str], Mapping[str, bytes]]],
    *,
    run: str,
    accused: str,
    round_: int,
    cid: Mapping[str, Any],
) -> ReputationVerdict:
    """The accused's closed record of ``round_`` is the one named and does not decode."""
    data = next((d for n, _, d in rounds if n == round_), {}).get(accused)
    if data is None:
        return _refuted(f"round {round_} closed with no score record of {accused[-8:]}")
    if str(score_record_cid(data)) != cid["score_record"]:
        return _refuted(f"{accused[-8:]}'s record of round {round_} is not the one named")
    try:
        open_score_record(data, run=run, round_=round_, signer=accused)
    except BadScoreRecordError:
        return ReputationVerdict(True, True, "")
    except PeerUpdateError as exc:
        return _refuted(f"the record's signature does not verify: {exc.reason}")
    return _refuted(f"{accused[-8:]}'s record of round {round_} decodes: it is a valid record")
