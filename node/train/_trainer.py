"""One node's training state across rounds, without the network.

:class:`NodeTrainer` owns the model, the agreed state and its CID, the rounds since the last
checkpoint and the ban policy. The network loop (_loop.py) calls it from a worker thread
(``trio.to_thread.run_sync``) so the host keeps serving blocks while torch computes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from typing import Any

import structlog
import torch

from cnode.aggregation import (
    ATTACKS,
    AggregationResult,
    BanPolicy,
    BanRecommendation,
    PeerRecord,
    combine_records,
)
from cnode.auth import Identity
from cnode.storage import CID, DAG_CBOR, BlockStore, load_checkpoint

from ._config import TrainingConfig
from ._exceptions import (
    CatchUpError,
    MalformedUpdateError,
    PeerUpdateError,
    StateMismatchError,
)
from ._outcome import OwnUpdate, RoundOutcome, finite_params
from ._round import (
    RoundResult,
    UpdateHeader,
    aggregate_round,
    encode_update,
    load_update,
    seal_update_header,
    store_update,
)
from .checkpoint import RoundLog, genesis_state, read_checkpoint_info, store_checkpoint
from .model import (
    DATA_ATTACKS,
    Placement,
    Residual,
    State,
    TextData,
    adopted_momentum,
    build_model,
    corrupt_data,
    drop_residual,
    evaluate,
    load_residual,
    save_residual,
    split_momentum,
    state_cid,
    train_local,
    uses_momentum,
    zero_momentum,
)
from .partition import (
    PartitionResult,
    PartitionTask,
    aggregate_own_partition,
    apply_partitions,
    seal_partition_result,
    state_numel,
    store_wrong_output,
)
from .scores import RoundScoring, SpreadScores, checkpoint_reputation

__all__ = ["NodeTrainer", "OwnUpdate", "RoundOutcome"]

log = structlog.get_logger(__name__)


class NodeTrainer:
    """The training side of one node of one run."""

    def __init__(
        self,
        config: TrainingConfig,
        *,
        run: str,
        identity: Identity,
        store: BlockStore,
        attack: str | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.config = config
        # Where local steps run (--device, --precision); the state and all else stay on the CPU.
        self.placement = placement or Placement(torch.device("cpu"), config.precision)
        self.run = run
        self.identity = identity
        self.peer = identity.peer_id_str
        self.store = store
        self.data = TextData.build(config.data, config.model)
        self.model: torch.nn.Module = build_model(config)
        torch.nn.Module.to(self.model, self.placement.device)  # in place, as modules move
        self.attack_name = attack
        self.train_data = self.data  # data attacks (flipped_tokens, ...) train on corrupted text
        if attack in DATA_ATTACKS:
            self.train_data = corrupt_data(self.data, attack, config.model.vocab_size)
            attack = None
        # Update attacks only; node attacks (withhold, wrong_partition) act elsewhere.
        self.attack = ATTACKS.get(attack or "")
        self.scoring = (
            RoundScoring(config, self.data, placement=self.placement) if config.scores else None
        )
        self._rng = torch.Generator().manual_seed(config.seed + 1)
        self.bans = BanPolicy()
        self.state: State = genesis_state(config)
        self.state_cid: CID = state_cid(self.state)
        # The outer momentum after self.round (nesterov; None for sgd): run state, like self.state.
        self.momentum: State | None = zero_momentum(self.state) if uses_momentum(config) else None
        self.round = 0  # the last round included in self.state
        self.checkpoint: CID | None = None  # the checkpoint self.state descends from
        self.since_checkpoint: list[RoundLog] = []
        # Error feedback: what the codec left out of this node's last update (local state).
        self.residual: Residual | None = None

    @property
    def pin_name(self) -> str:
        """The pin under which this node keeps its latest checkpoint (what a restart resumes)."""
        return f"train-{self.run}-latest"

    # -- starting points ---------------------------------------------------------------------

    def adopt_checkpoint(self, cid: CID) -> None:
        """Take a checkpoint (all blocks in the store) as the current state, after checking it."""
        info = read_checkpoint_info(self.store, cid)
        if info.run != self.run:
            raise CatchUpError(f"checkpoint {cid} is of run {info.run!r}, not {self.run!r}")
        stored, _ = load_checkpoint(self.store, cid)
        tensors, momentum = split_momentum(stored)
        got = state_cid(tensors)
        if info.state_cid is not None and got != info.state_cid:
            raise CatchUpError(
                f"checkpoint {cid}: its tensors give state {got}, it claims {info.state_cid}"
            )
        if set(tensors) != set(self.state):
            raise CatchUpError(f"checkpoint {cid} does not fit the run's model")
        self.momentum = adopted_momentum(self.config, tensors, momentum, str(cid), info.round)
        self.state, self.state_cid, self.round = tensors, got, info.round
        self.checkpoint, self.since_checkpoint = cid, []
        if self.config.scores:  # reputations as the checkpoint recorded them
            self.scoring = RoundScoring(
                self.config, self.data, checkpoint_reputation(info.manifest), self.placement
            )
        # Re-synced from a checkpoint: the residual belongs to rounds this state did not see.
        self.residual = None
        drop_residual(self.store, self.run)
        log.info("checkpoint_adopted", checkpoint=str(cid), round=info.round, state=str(got))

    def resume_checkpoint(self, cid: CID) -> None:
        """Restart from this node's own pinned checkpoint, keeping its residual when it fits.

        The residual is kept only when it came from the round this checkpoint ends with (the
        node trained it and went on from its result) and has the state's names and shapes.
        """
        residual = load_residual(self.store, self.run)
        self.adopt_checkpoint(cid)
        if residual is None or residual.round != self.round:
            return
        fits = set(residual.tensors) == set(self.state) and all(
            residual.tensors[n].shape == t.shape for n, t in self.state.items()
        )
        if fits:
            self.residual = residual
            save_residual(self.store, self.run, residual)
            log.info("residual_resumed", round=residual.round)

    # -- a round -----------------------------------------------------------------------------

    def train(self, round_: int) -> OwnUpdate:
        """Train on the current state, store the update and the signed header; return them."""
        if round_ != self.round + 1:
            raise CatchUpError(f"cannot train round {round_}: the state is of round {self.round}")
        local = train_local(self.model, self.state, self.train_data, self.config, peer_id=self.peer,
                            round_=round_, placement=self.placement)  # fmt: skip
        began = time.perf_counter()
        delta = local.delta
        if self.attack is not None:
            # Testing aid (`--attack`): send what the attack harness makes of the honest update.
            delta = self.attack([], delta, self._rng, 1, 1)
            delta = {k: t.to(torch.float32).contiguous() for k, t in delta.items()}
        codec = self.config.wire_codec
        if self.residual is not None and self.residual.round == round_ - 1:
            delta = {k: t + self.residual.tensors[k] for k, t in delta.items()}
        encoded, decoded = encode_update(delta, codec)
        update = store_update(
            self.store, encoded, run=self.run, round_=round_, base=self.state_cid, codec=codec
        )
        if codec != "f32":
            left = {k: (delta[k] - decoded[k]).contiguous() for k in sorted(delta)}
            self.residual = Residual(round_, left)
            save_residual(self.store, self.run, self.residual)
        header = UpdateHeader(self.run, round_, self.peer, local.samples, update, self.state_cid)
        envelope = seal_update_header(self.identity, header)
        cid = self.store.put_new(envelope, DAG_CBOR)
        return OwnUpdate(round_, header, envelope, cid, local, time.perf_counter() - began)

    def check_agreement(self, round_: int, headers: Mapping[str, UpdateHeader]) -> None:
        """Raise StateMismatchError when most other members trained from another state.

        Every header names the state its update was trained from (``base``): the state the
        swarm agreed on after round ``round_ - 1``. A minority with another base is dropped from
        the round (their fault); a strict majority of the other members agreeing on a base that
        is not this node's means this node diverged: it stops loudly, never repairs silently.
        """
        others = [h.base for peer, h in headers.items() if peer != self.peer]
        foreign = collections.Counter(b for b in others if b != self.state_cid)
        if not foreign:
            return
        base, count = foreign.most_common(1)[0]
        if 2 * count > len(others):
            raise StateMismatchError(
                f"round {round_}: {count} of {len(others)} other members trained from state "
                f"{base}, this node holds {self.state_cid} after round {self.round}"
            )

    def aggregate(
        self, round_: int, headers: Mapping[str, tuple[CID, UpdateHeader]], dropped: dict[str, str]
    ) -> RoundOutcome:
        """Aggregate the members' updates (blocks in the store), apply, and advance the state."""
        began = time.perf_counter()
        if round_ != self.round + 1:
            raise StateMismatchError(
                f"asked to aggregate round {round_} on the state of {self.round}"
            )
        updates: dict[str, State] = {}
        dropped = dict(dropped)
        used: dict[str, CID] = {}
        malformed: dict[str, PeerRecord] = {}  # provably bad bytes: ban evidence, like NaN
        for peer in sorted(headers):
            cid, header = headers[peer]
            if header.base != self.state_cid:
                dropped[peer] = f"trained from state {header.base}, not {self.state_cid}"
                continue
            try:
                updates[peer] = load_update(
                    self.store,
                    header.update,
                    peer=peer,
                    codec=self.config.wire_codec,
                    shapes=self.state,
                )
            except MalformedUpdateError as exc:
                dropped[peer] = exc.reason
                malformed[peer] = PeerRecord(peer, None, None, rejected=exc.reason)
                continue
            except PeerUpdateError as exc:
                dropped[peer] = exc.reason
                continue
            used[peer] = cid
        rule, scored = self.config, None
        if self.scoring is not None:  # score, move reputations, admit (_scores.py)
            scored = self.scoring.score(round_, self.state, updates, used)
            updates, rule = (
                self.scoring.admitted_updates(scored, updates),
                self.scoring.rule_config(),
            )
        result = aggregate_round(self.state, updates, rule, self.momentum)
        update_cids = {p: str(headers[p][1].update) for p in [*used, *malformed]}
        records = {**result.aggregation.records, **malformed}
        bans = self.bans.observe(round_, records, update_cids)
        if self.scoring is not None and scored is not None:
            bans += self.scoring.bans(scored, update_cids)
        self.state, self.state_cid, self.round = result.state, result.state_cid, round_
        self.momentum = result.momentum
        self.since_checkpoint.append(
            RoundLog(
                round_,
                result.state_cid,
                tuple(used[p] for p in sorted(used)),
                finite_params(result.aggregation.params)
                | ({"scores": scored.to_params()} if scored is not None else {}),
            )
        )
        log.info(
            "round_aggregated",
            round=round_,
            state=str(result.state_cid),
            members=len(updates),
            dropped=len(dropped),
        )
        return RoundOutcome(
            round_,
            result,
            tuple(sorted(updates)),
            dropped,
            bans,
            time.perf_counter() - began,
        )

    # -- a partitioned round (specs/training.md#partitioned-rounds) ---------------------------

    def aggregate_partition(
        self,
        round_: int,
        headers: Mapping[str, tuple[CID, UpdateHeader]],
        *,
        partition: int,
        parts: int,
        missing: Mapping[str, str],
        backup_for: str | None = None,
    ) -> tuple[bytes, PartitionResult]:
        """Aggregate this node's partition of the updates ``headers`` name (their partition's
        segments in the store), store the output and sign the result; return both."""
        task = PartitionTask(
            self.run, round_, partition, parts, state_numel(self.state), self.state_cid
        )
        work = aggregate_own_partition(
            self.store, {m: h for m, (_, h) in headers.items()}, task, self.config
        )
        output = work.output
        if self.attack_name == "wrong_partition" and output is not None:
            # Testing aid (`--attack wrong_partition`): sign an output its inputs do not give.
            output = store_wrong_output(
                self.store, output, self.config.result_codec, numel=state_numel(self.state)
            )
        result = PartitionResult(
            self.run,
            round_,
            partition,
            parts,
            self.peer,
            self.state_cid,
            {m: cid for m, (cid, _) in headers.items()},
            work.rejected,
            {**missing, **work.skipped},
            output,
            {m: (float(r.distance or 0.0), r.clip_weight) for m, r in work.records.items()},
            backup_for,
        )
        return seal_partition_result(self.identity, result), result

    def apply_partitions(
        self,
        round_: int,
        results: Mapping[int, tuple[CID, PartitionResult]],
        outputs: Mapping[int, CID | None],
        *,
        parts: int,
        dropped: dict[str, str],
        scores: SpreadScores | None = None,
    ) -> RoundOutcome:
        """Assemble the round's state from the partitions' outputs (blocks in the store).

        ``results``: the recorded, checked result of each partition that has one; ``outputs``:
        what each partition applies (the result's output, or the coordinator's recomputation
        when the result was found wrong). Ban evidence comes from the combined records, and
        with ``scores`` (the round's agreed scores) from reputations and wrong score records.
        """
        began = time.perf_counter()
        if round_ != self.round + 1:
            raise StateMismatchError(
                f"asked to assemble round {round_} on the state of {self.round}"
            )
        new, momentum = apply_partitions(
            self.store, self.state, outputs, parts=parts, config=self.config, momentum=self.momentum
        )
        new_cid = state_cid(new)
        per_partition = []
        update_cids: dict[str, str] = {}
        inputs: set[CID] = set()
        for p in sorted(results):
            _, result = results[p]
            records = {m: PeerRecord(m, d, c, None) for m, (d, c) in result.records.items()}
            records.update(
                {m: PeerRecord(m, None, None, why) for m, why in result.rejected.items()}
            )
            per_partition.append(records)
            inputs.update(result.inputs.values())
        combined = combine_records(per_partition)
        for _, result in results.values():
            dropped.update({m: why for m, why in result.missing.items() if m not in combined})
            for m, cid in result.inputs.items():
                update_cids.setdefault(m, str(cid))
        bans = self.bans.observe(round_, combined, update_cids)
        members = tuple(sorted(m for m, r in combined.items() if r.rejected is None))
        dropped.update({m: r.rejected or "" for m, r in combined.items() if r.rejected})
        cids = tuple(sorted((cid for cid, _ in results.values()), key=str))
        params: dict[str, Any] = {
            "parts": parts,
            "partitions": len(results),
            "members": len(members),
        }
        empty = not results  # the same verdict on every node: results are the recorded ones
        if empty:
            # No partition result: the state stays the parent's. Nothing is logged for the
            # round (a replay has nothing to recompute) and its scores move no reputation (no
            # update was applied); a wrong score record is still evidence.
            if scores is not None:
                bans += list(scores.wrong)
            self.round = round_
            log.warning(
                "round_exchanged_nothing",
                round=round_,
                parts=parts,
                why="no partition has a result: no aggregator, nor any backup, got enough "
                "members' updates by the deadline (are the members' addresses reachable?)",
            )
            return RoundOutcome(
                round_,
                RoundResult(self.state, self.state_cid, AggregationResult({}, combined, {})),
                (),
                dropped,
                bans,
                time.perf_counter() - began,
                empty=True,
            )
        if scores is not None and self.scoring is not None:
            bans += self._spread_bans(round_, scores)
            dropped.update({m: why for m, why in scores.left_out.items() if m not in combined})
            params["scores"] = scores.to_params()
            # The manifest lists only what the agreed round decides, never what this node
            # happens to hold (a header fetched here but not there made honest nodes' manifests
            # differ): every score record, and the header of each disputed target (a replay
            # recomputes those). The seed's full input is in params["scores"]["headers"].
            disputed = {str(w.figures.get("target")) for w in scores.wrong}
            inputs.update(c for m, c in scores.headers.items() if m in disputed)
            cids += tuple(sorted(scores.records.values(), key=str))
        cids += tuple(sorted(inputs, key=str))
        self.state, self.state_cid, self.round = new, new_cid, round_
        self.momentum = momentum
        self.since_checkpoint.append(RoundLog(round_, new_cid, cids, params))
        log.info("round_assembled", round=round_, state=str(new_cid), parts=parts)
        nothing = AggregationResult({}, combined, params)
        return RoundOutcome(
            round_,
            RoundResult(new, new_cid, nothing),
            members,
            dropped,
            bans,
            time.perf_counter() - began,
        )

    def _spread_bans(self, round_: int, scores: SpreadScores) -> list[BanRecommendation]:
        """Take the round's agreed reputations; reputation and wrong-score ban evidence."""
        assert self.scoring is not None
        self.scoring.reputation = dict(scores.reputation)
        out = list(scores.wrong)
        if scores.scores:
            cids = {t: str(x.header) for t, x in scores.losses.items()}
            out += self.scoring.policy.observe(
                round_, scores.seed, scores.scores, scores.reputation, cids
            )
        return out

    def evaluate(self) -> float:
        """Held-out loss of the current state (the same figure on every node that holds it)."""
        return evaluate(self.model, self.state, self.data)

    def store_checkpoint(self) -> CID:
        """Store the current state as a checkpoint; every honest node gets the same manifest CID."""
        cid = store_checkpoint(
            self.store,
            self.state,
            momentum=self.momentum,
            run=self.run,
            round_=self.round,
            parent=self.checkpoint,
            config=self.config,
            rounds=self.since_checkpoint,
            tokenizer_json=self.data.tokenizer_json,
        )
        self.store.pin(self.pin_name, cid)
        self.checkpoint, self.since_checkpoint = cid, []
        return cid
