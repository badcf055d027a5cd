"""Scores of a round's updates and the reputation across rounds, on the node (issue 12).

With ``training.scores = true`` every node, and every replay, does for each round:

1. the **seed**: ``score_seed`` of the CIDs of the signed headers whose updates the round uses
   (the agreed input set, fixed only after every header is out; a checkpoint lists them);
2. for each update that passes ``validate_update``: four losses of the run's model in eval mode
   (no dropout), on ``SCORE_SEQUENCES`` sequences drawn by ``draw_indices``: from the shard the
   sender trained on in this round (``TextData.shard(peer, round, seed=run seed)``, the one
   assignment trainer, scorers and replay compute; purpose ``"own:<peer id>"``) and from the shared
   held-out split (``TextData.eval``, purpose ``"held"``), each before (the agreed state) and
   after (state + SCORE_STEP x update). Computed in float32 on the node's device, or in float64
   on the CPU where a score is within BOUNDARY_UNITS of a rounding boundary (_settle.py);
3. the integer scores, then the round decision's admission (``cnode.aggregation.admission``:
   standings, the reputation after the round, the admitted set and why the others are out);
4. CenteredClip on the admitted updates with ``scored_config()``; the updates of peers left out
   are not aggregated; rejected (malformed) updates are still passed on, so they are recorded as
   ban evidence as before;
5. the trainer's ``RoundEvidence`` takes the scores and the admission: reputation, blatant and
   left-out ban evidence join the round's.

Everything is recorded in the round's ``params["scores"]`` (see :meth:`ScoredRound.to_params`), so
``verify --replay`` recomputes and compares it. _settle.py's rule makes the integer scores (and
every decision taken on them) the same on every device; a replay compares losses within
SCORE_LOSS_RTOL and integers exactly. See specs/training.md#scores.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cnode.aggregation import (
    Admission,
    UpdateScore,
    admission,
    draw_indices,
    score_seed,
    score_update,
    scored_config,
    validate_update,
)
from cnode.storage import CID

from .. import limits
from .._config import TrainingConfig
from .._exceptions import ReplayMismatchError
from .._round import expected_specs
from ..model import Placement, State, TextData
from ._settle import LossModels, settle_needed

# An update as scoring reads it: a dict, or a mapping that decodes a layer when it is looked up
# (_segmented.SegmentedUpdate, a full round past WHOLE_UPDATES_MAX_BYTES).
Update = Mapping[str, torch.Tensor]

__all__ = [
    "RoundScoring",
    "ScoredRound",
    "check_recorded_scores",
    "checkpoint_reputation",
    "recorded_reputation",
]


def _loss_text(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)  # DAG-CBOR has no NaN/Infinity


@dataclass(frozen=True)
class ScoredRound:
    """What scoring decided in one round."""

    round: int
    seed: bytes
    scores: dict[str, UpdateScore]  # every validated update, by peer
    decision: Admission  # the round decision's admission: who is in, why the others are not

    @property
    def admitted(self) -> tuple[str, ...]:
        """Peers whose update is aggregated."""
        return self.decision.admitted

    @property
    def reputation(self) -> dict[str, int]:
        """After this round, every peer ever scored."""
        return self.decision.reputation

    def to_params(self) -> dict[str, Any]:
        """The round's ``params["scores"]``: seed (hex), per peer [own_before, own_after,
        held_before, held_after, own, held, score], admitted peers, reputation after the round."""
        return {
            "seed": self.seed.hex(),
            "peers": {
                p: [
                    *(
                        _loss_text(v)
                        for v in (s.own_before, s.own_after, s.held_before, s.held_after)
                    ),
                    s.own,
                    s.held,
                    s.score,
                ]
                for p, s in sorted(self.scores.items())
            },
            "admitted": list(self.admitted),
            "reputation": dict(sorted(self.reputation.items())),
        }


class RoundScoring:
    """Scores, reputation and reputation bans of one run, round after round (one per node)."""

    def __init__(
        self,
        config: TrainingConfig,
        data: TextData,
        reputation: Mapping[str, int] | None = None,
        placement: Placement | None = None,  # where the fast losses run (default: the CPU)
    ) -> None:
        self.config = config
        self.data = data
        self.reputation: dict[str, int] = dict(reputation or {})
        self.models = LossModels(config, placement)

    def rule_config(self) -> TrainingConfig:
        """The run's config with the rule run on admitted updates (``scored_config()``)."""
        rule = scored_config()
        return dataclasses.replace(
            self.config, aggregator=rule.name, aggregator_params=dict(rule.params)
        )

    def _batches(self, round_: int, seed: bytes, peer: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The scoring batches of ``peer``'s update of ``round_``: from the shard it trained on
        in that round (its own data), and from the held-out split."""
        n = limits.SCORE_SEQUENCES
        held = self.data.eval[torch.tensor(draw_indices(seed, "held", len(self.data.eval), n))]
        shard = self.data.shard(peer, round_, seed=self.config.seed)
        own = self.data.train[shard[draw_indices(seed, f"own:{peer}", len(shard), n)]]
        return own, held

    def _reference(self, parent: State, update: Update, own: torch.Tensor, held: torch.Tensor
                   ) -> tuple[float, float, float, float]:  # fmt: skip
        self.models.settled += 1
        own_before, held_before = self.models.reference(parent, None, [own, held])
        own_after, held_after = self.models.reference(parent, update, [own, held])
        return own_before, own_after, held_before, held_after

    def measure(
        self, round_: int, seed: bytes, parent: State, peer: str, update: Update
    ) -> tuple[float, float, float, float]:
        """The four losses of ``peer``'s update of ``round_`` (own before/after, held
        before/after): :meth:`measure_targets` of that one update."""
        return self.measure_targets(round_, seed, parent, {peer: update})[peer]

    def measure_targets(
        self, round_: int, seed: bytes, parent: State, updates: Mapping[str, Update]
    ) -> dict[str, tuple[float, float, float, float]]:
        """The four losses of each update of ``round_`` (own before/after, held before/after),
        as :meth:`score` takes them: what a scorer of a partitioned round signs for its targets.

        Every "before" loss comes from one batched pass at the agreed state (the held-out batch,
        the same for every target, and each target's own batch); then one pass per update. The
        integers are the same however the targets are grouped (the fast losses may differ in
        the last bits, since the batches share other forward passes: _settle.py's rule)."""
        peers = sorted(updates)
        if not peers:
            return {}
        batches = {p: self._batches(round_, seed, p) for p in peers}
        held = batches[peers[0]][1]
        before = self.models.fast(parent, None, [held, *(batches[p][0] for p in peers)])
        out = {}
        for i, peer in enumerate(peers):
            own, held_p = batches[peer]
            own_after, held_after = self.models.fast(parent, updates[peer], [own, held_p])
            losses = (before[1 + i], own_after, before[0], held_after)
            if settle_needed(losses):
                losses = self._reference(parent, updates[peer], own, held_p)
            out[peer] = losses
        return out

    def score(
        self, round_: int, parent: State, updates: Mapping[str, Update], headers: Mapping[str, CID]
    ) -> ScoredRound:
        """Score the round's updates (``headers``: peer -> its signed header CID, for the seed),
        move the reputation, and say who is admitted."""
        if not headers:
            return ScoredRound(round_, b"", {}, admission({}, self.reputation))
        seed = score_seed(str(c) for c in headers.values())
        specs = expected_specs(parent)
        valid = {p: u for p, u in updates.items() if validate_update(u, specs) is None}
        # (an invalid update: aggregate() rejects it with the reason, ban evidence as before)
        measured = self.measure_targets(round_, seed, parent, valid)
        scores = {p: score_update(p, *measured[p]) for p in sorted(measured)}
        decided = admission(scores, self.reputation)
        self.reputation = dict(decided.reputation)
        return ScoredRound(round_, seed, scores, decided)

    def admitted_updates(
        self, scored: ScoredRound, updates: Mapping[str, Update]
    ) -> dict[str, Update]:
        """The updates aggregate() gets: the admitted ones, and the invalid ones (to be rejected
        with their reason); a valid update that was not admitted is left out."""
        keep = set(scored.admitted)
        return {p: u for p, u in updates.items() if p in keep or p not in scored.scores}


def recorded_reputation(rounds: Any) -> dict[str, int]:
    """The reputation after the last round of a checkpoint's aggregation record
    (``params["rounds"]``: ``[[round, params], ...]``); empty when it has none."""
    if not isinstance(rounds, list) or not rounds:
        return {}
    last = rounds[-1]
    params = last[1] if isinstance(last, list) and len(last) == 2 else {}
    scores = params.get("scores") if isinstance(params, dict) else None
    rep = scores.get("reputation") if isinstance(scores, dict) else None
    if not isinstance(rep, dict):
        return {}
    return {str(p): int(v) for p, v in rep.items() if isinstance(v, int)}


def checkpoint_reputation(manifest: Any) -> dict[str, int]:
    """The reputation after the last round a checkpoint manifest records ({} for none)."""
    meta = getattr(manifest, "meta", manifest)
    record = getattr(meta, "aggregation", None)
    return recorded_reputation(record.params.get("rounds") if record is not None else None)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=limits.SCORE_LOSS_RTOL, abs_tol=0.0)
    return bool(a == b)


def check_recorded_scores(recorded: Any, replayed: Mapping[int, Mapping[str, Any]]) -> None:
    """Compare a checkpoint's recorded ``scores`` with the replay's, round by round.

    Integers (scores, admitted peers, reputations) and the seed must be equal; losses equal
    within SCORE_LOSS_RTOL. Raises ReplayMismatchError naming the first difference.
    """
    rows = recorded if isinstance(recorded, list) else []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 2 and isinstance(row[1], dict)):
            raise ReplayMismatchError("the aggregation record's rounds are malformed")
        number, params = row
        want, got = params.get("scores"), replayed.get(number, {}).get("scores")
        if want is None and got is None:
            continue
        if not (isinstance(want, dict) and isinstance(got, dict)):
            raise ReplayMismatchError(
                f"round {number}: scores recorded {want is not None}, replayed {got is not None}"
            )
        for key in ("seed", "admitted", "reputation"):
            if want.get(key) != got.get(key):
                raise ReplayMismatchError(f"round {number}: replayed {key} differs from the record")
        wp, gp = want.get("peers"), got.get("peers")
        if not isinstance(wp, dict) or not isinstance(gp, dict) or set(wp) != set(gp):
            raise ReplayMismatchError(f"round {number}: the scored peers differ from the record")
        for peer in sorted(wp):
            a, b = wp[peer], gp[peer]
            if not (isinstance(a, list) and len(a) == len(b)):
                raise ReplayMismatchError(f"round {number}: malformed scores of {peer}")
            if not all(_close(x, y) for x, y in zip(a, b, strict=True)):
                raise ReplayMismatchError(
                    f"round {number}: scores of {peer} differ: recorded {a}, replayed {b}"
                )
