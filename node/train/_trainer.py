"""One node's training state across rounds, without the network.

:class:`NodeTrainer` owns the model, the agreed state and its CID, the rounds since the last
checkpoint and the round's ban evidence (``RoundEvidence``). The network loop (_loop.py) calls
it from a worker thread (``trio.to_thread.run_sync``) so the host keeps serving blocks while
torch computes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping

import structlog
import torch

from cnode.aggregation import (
    ATTACKS,
    PeerRecord,
    RoundEvidence,
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
    UpdateHeader,
    aggregate_round,
    encode_update,
    load_update,
    seal_update_header,
    store_update,
    streams_updates,
)
from ._segmented import SegmentedUpdate
from ._trainer_partitioned import PartitionedRounds
from .checkpoint import RoundLog, genesis_state, read_training_checkpoint, store_checkpoint
from .model import (
    DATA_ATTACKS,
    InnerMoments,
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
    with_residual,
    zero_momentum,
)
from .scores import RoundScoring, checkpoint_reputation

__all__ = ["NodeTrainer", "OwnUpdate", "RoundOutcome"]

log = structlog.get_logger(__name__)


class NodeTrainer(PartitionedRounds):
    """The training side of one node of one run (a partitioned round's part:
    ``_trainer_partitioned.py``)."""

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
        # The round decision's ban evidence, kept across rounds (cnode.aggregation, issue 36).
        self.evidence = RoundEvidence(scored=config.scores)
        self.state: State = genesis_state(config)
        self.state_cid: CID = state_cid(self.state)
        # The outer momentum after self.round (nesterov; None for sgd): run state, like self.state.
        self.momentum: State | None = zero_momentum(self.state) if uses_momentum(config) else None
        self.round = 0  # the last round included in self.state
        self.checkpoint: CID | None = None  # the checkpoint self.state descends from
        self.since_checkpoint: list[RoundLog] = []
        # Error feedback: what the codec left out of this node's last update (local state).
        self.residual: Residual | None = None
        # This node's local AdamW moments, carried from round to round ("keep"): local state,
        # never sent nor checked by others; in memory only, so a restart starts them afresh.
        keep = config.inner_optimizer_state == "keep"
        self.moments: InnerMoments | None = InnerMoments() if keep else None

    @property
    def pin_name(self) -> str:
        """The pin under which this node keeps its latest checkpoint (what a restart resumes)."""
        return f"train-{self.run}-latest"

    # -- starting points ---------------------------------------------------------------------

    def adopt_checkpoint(self, cid: CID) -> None:
        """Take a checkpoint (all blocks in the store) as the current state, after checking it."""
        info = read_training_checkpoint(self.store, cid)
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
        if self.moments is not None:  # likewise the moments: the next round starts them fresh
            self.moments.clear()
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
        # A dataset of many files: the next round's file downloads while this round trains.
        self.data.prefetch(self.peer, round_ + 1, seed=self.config.seed)
        local = train_local(self.model, self.state, self.train_data, self.config, peer_id=self.peer,
                            round_=round_, placement=self.placement,
                            moments=self.moments)  # fmt: skip
        began = time.perf_counter()
        delta = local.delta
        if self.attack is not None:
            # Testing aid (`--attack`): send what the attack harness makes of the honest update.
            delta = self.attack([], delta, self._rng, 1, 1)
            delta = {k: t.to(torch.float32).contiguous() for k, t in delta.items()}
        codec = self.config.wire_codec
        if self.residual is not None and self.residual.round == round_ - 1:
            delta = with_residual(delta, self.residual, self.config.error_decay)
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
        updates: dict[str, Mapping[str, torch.Tensor]] = {}
        dropped = dict(dropped)
        used: dict[str, CID] = {}
        malformed: dict[str, PeerRecord] = {}  # provably bad bytes: ban evidence, like NaN
        # n whole decoded updates past WHOLE_UPDATES_MAX_BYTES: read them one layer at a time
        # instead (the same bits; specs/training.md#memory).
        by_layer = streams_updates(len(headers), self.state)
        for peer in sorted(headers):
            cid, header = headers[peer]
            if header.base != self.state_cid:
                dropped[peer] = f"trained from state {header.base}, not {self.state_cid}"
                continue
            try:
                updates[peer] = (SegmentedUpdate if by_layer else load_update)(
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
        result = aggregate_round(self.state, updates, rule, self.momentum, by_layer=by_layer)
        update_cids = {p: str(headers[p][1].update) for p in [*used, *malformed]}
        records = {**result.aggregation.records, **malformed}
        bans = self.evidence.observe(round_, records, update_cids=update_cids,
                                     scores=scored and scored.scores, seed=scored.seed if scored
                                     else b"", decided=scored and scored.decision)  # fmt: skip
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
        taken = tuple(sorted(p for p in updates if p not in records or not records[p].rejected))
        return RoundOutcome(
            round_,
            result,
            taken,  # the updates aggregated: admitted, and not rejected (as a partitioned round)
            dropped,
            bans,
            time.perf_counter() - began,
        )

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
