"""Scores on the node's device (issue 26): fast float32 losses, the float64 reference near a
rounding boundary, and the same integer scores as the reference whatever the arithmetic."""

from __future__ import annotations

import pytest
import torch

from cnode.aggregation import limits as agg_limits
from cnode.aggregation import loss_score, score_seed, score_update
from cnode.node.train import TextData, TrainingConfig, TrainingConfigError, build_model, model_state
from cnode.node.train.limits import SCORE_DEVICE_RTOL, SCORE_LOSS_RTOL
from cnode.node.train.scores import BOUNDARY_UNITS, RoundScoring, near_boundary, settle_needed

SMALL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32}
CONFIG = TrainingConfig.for_run(
    {"model": SMALL, "data": {"seq_len": 32, "eval_sequences": 16}, "partitioned": "never"}
)


def _after(x_units: float, before: float = 5.0) -> float:
    """The loss after an update whose score is ``x_units`` (real-valued) from ``before``."""
    return before * (1 - x_units * agg_limits.SCORE_UNIT)


def test_the_boundary_follows_from_the_device_tolerance() -> None:
    assert pytest.approx(2 * SCORE_DEVICE_RTOL / agg_limits.SCORE_UNIT) == BOUNDARY_UNITS
    assert SCORE_LOSS_RTOL == 2 * SCORE_DEVICE_RTOL
    assert 0 < BOUNDARY_UNITS < 0.5  # a boundary band narrower than a unit: most scores are fast


@pytest.mark.parametrize(
    ("before", "after", "near"),
    [
        (5.0, _after(12.5), True),  # on a boundary
        (5.0, _after(12.5 + BOUNDARY_UNITS / 2), True),
        (5.0, _after(-3.5 - BOUNDARY_UNITS / 2), True),
        (5.0, _after(12.0), False),  # the middle of a unit
        (5.0, _after(12.5 + 2 * BOUNDARY_UNITS), False),
        (5.0, float("inf"), True),  # not finite: the reference says
        (5.0, float("nan"), True),
        (0.0, 1.0, True),  # a before loss that cannot be scored
    ],
)
def test_near_boundary(before: float, after: float, near: bool) -> None:
    assert near_boundary(before, after) is near


def test_a_fast_score_off_the_boundary_rounds_as_the_reference_does() -> None:
    # Every fast loss within SCORE_DEVICE_RTOL of the reference: the integer is the same.
    for x in (3.0, 3.3, 3.45, -7.2, 120.44):
        if near_boundary(5.0, _after(x)):
            continue
        for err_b, err_a in ((1, -1), (-1, 1), (1, 1)):
            before = 5.0 * (1 + err_b * SCORE_DEVICE_RTOL)
            after = _after(x) * (1 + err_a * SCORE_DEVICE_RTOL)
            assert loss_score(before, after) == loss_score(5.0, _after(x))


def _updates(state: dict[str, torch.Tensor], n: int, scale: float) -> dict[str, dict]:
    g = torch.Generator().manual_seed(1)
    return {
        f"peer-{i}": {k: torch.randn(t.shape, generator=g) * scale for k, t in state.items()}
        for i in range(n)
    }


def test_fast_scores_give_the_references_integers_and_near_ones_take_its_losses() -> None:
    data = TextData.build(CONFIG.data, CONFIG.model)
    state = model_state(build_model(CONFIG))
    updates = _updates(state, 8, 3e-3)
    headers = {p: f"bafy-header-{p}" for p in updates}
    scoring = RoundScoring(CONFIG, data)
    scored = scoring.score(1, state, updates, headers)
    seed = score_seed(headers.values())
    for peer, update in updates.items():
        own, held = scoring._batches(1, seed, peer)  # the batches score() took
        ob, hb = scoring.models.reference(state, None, [own, held])
        oa, ha = scoring.models.reference(state, update, [own, held])
        reference = score_update(peer, ob, oa, hb, ha)
        got = scored.scores[peer]
        assert (got.own, got.held, got.score) == (reference.own, reference.held, reference.score)
        fast = (got.own_before, got.own_after, got.held_before, got.held_after)
        for a, b in zip(fast, (ob, oa, hb, ha), strict=True):
            assert abs(a - b) <= SCORE_DEVICE_RTOL * abs(b)  # the tolerance holds here
        if settle_needed(fast):  # pragma: no cover - only when a score sits on a boundary
            assert fast == (ob, oa, hb, ha)
    # measure() (a partitioned round's scorer) gives score()'s integers, its losses within the
    # tolerance (score() runs every "before" batch in one forward pass).
    for peer in sorted(updates)[:2]:
        measured = scoring.measure(1, seed, state, peer, updates[peer])
        s = scored.scores[peer]
        recorded = (s.own_before, s.own_after, s.held_before, s.held_after)
        assert all(
            abs(a - b) <= SCORE_LOSS_RTOL * abs(b) for a, b in zip(measured, recorded, strict=True)
        )
        again = score_update(peer, *measured)
        assert (again.own, again.held, again.score) == (s.own, s.held, s.score)


def test_a_score_near_a_boundary_is_settled_by_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = TextData.build(CONFIG.data, CONFIG.model)
    state = model_state(build_model(CONFIG))
    scoring = RoundScoring(CONFIG, data)
    peer, update = next(iter(_updates(state, 1, 3e-3).items()))
    seed = score_seed(["bafy-header"])
    own, held = scoring._batches(1, seed, peer)
    ob, hb = scoring.models.reference(state, None, [own, held])
    oa, ha = scoring.models.reference(state, update, [own, held])
    # A band as wide as a unit puts every score "near a boundary": the reference settles all.
    monkeypatch.setattr("cnode.node.train.scores._settle.BOUNDARY_UNITS", 0.5)
    assert scoring.measure(1, seed, state, peer, update) == (ob, oa, hb, ha)
    assert scoring.models.settled == 1
    scored = scoring.score(1, state, {peer: update}, {peer: "bafy-header"})
    assert scored.scores[peer].held_after == ha and scoring.models.settled == 2


def test_the_fast_model_keeps_the_state_only_while_it_is_unchanged() -> None:
    # The state's copy on the device is reused across targets; a changed state is copied again.
    from cnode.node.train.scores import LossModels

    model = build_model(CONFIG)
    state = model_state(model)
    update = _updates(state, 1, 0.01)["peer-0"]
    data = TextData.build(CONFIG.data, CONFIG.model)
    batch = [data.eval[:4]]
    models = LossModels(CONFIG)
    first = models.fast(state, None, batch)
    moved = models.fast(state, update, batch)
    assert models.fast(state, None, batch) == first  # the same state: the same losses
    assert moved != first
    assert moved == pytest.approx(models.reference(state, update, batch), rel=SCORE_DEVICE_RTOL)
    with torch.no_grad():  # written in place: the next call must see it
        next(iter(state.values())).add_(0.5)
    changed = models.fast(state, None, batch)
    assert changed != first
    assert changed == pytest.approx(models.reference(state, None, batch), rel=SCORE_DEVICE_RTOL)
    fresh = {k: t.clone() for k, t in state.items()}  # other objects, the same values
    assert models.fast(fresh, None, batch) == changed
    bad = {**state, "transformer.wte.weight": torch.zeros(3, 3)}
    with pytest.raises(TrainingConfigError, match=r"transformer\.wte\.weight has shape"):
        models.fast(bad, None, batch)


def test_an_update_staged_in_one_buffer_gives_the_losses_of_one_copied_per_layer() -> None:
    # A CUDA node gathers each update into one buffer before it crosses (stage_transfers); the
    # losses must be those of the per-layer copy, bit for bit, for every update in turn.
    from cnode.node.train.scores import LossModels

    state = model_state(build_model(CONFIG))
    updates = _updates(state, 2, 0.01)
    batch = [TextData.build(CONFIG.data, CONFIG.model).eval[:4]]
    staged, per_layer = LossModels(CONFIG, stage_transfers=True), LossModels(CONFIG)
    assert not per_layer.stage_transfers  # the CPU's default
    for update in [*updates.values(), *updates.values()]:
        assert staged.fast(state, update, batch) == per_layer.fast(state, update, batch)
    # A state that must be converted is staged too (on a CUDA device every state is).
    state64 = {k: t.double() for k, t in state.items()}
    for update in [None, *updates.values()]:
        assert staged.fast(state64, update, batch) == per_layer.fast(state64, update, batch)
    bad = {**updates["peer-0"], "transformer.wte.weight": torch.zeros(3, 3)}
    with pytest.raises(TrainingConfigError, match=r"update layer transformer\.wte\.weight"):
        staged.fast(state, bad, batch)


def test_scorers_take_the_own_batch_from_the_shard_the_sender_trained_on_that_round() -> None:
    data = TextData.build(CONFIG.data, CONFIG.model)
    assert data.assignment == "rotate"
    scoring = RoundScoring(CONFIG, data)
    seed = score_seed(["bafy-header"])
    peer = "12D3KooWscored"

    def rows(t: torch.Tensor) -> set[tuple[int, ...]]:
        return {tuple(r.tolist()) for r in t}

    shards_seen = set()
    for round_ in range(1, CONFIG.data.n_shards + 1):
        shard = data.shard_index(peer, round_, seed=CONFIG.seed)
        shards_seen.add(shard)
        in_shard = rows(data.train[data.shard_of_index(shard)])
        trained = data.batches(peer, round_, seed=CONFIG.seed, steps=2, batch_size=4)
        assert all(rows(b) <= in_shard for b in trained)  # the trainer's data of the round ...
        own, held = scoring._batches(round_, seed, peer)
        assert rows(own) <= in_shard  # ... is where every scorer draws its own batch from
        assert torch.equal(held, scoring._batches(round_ + 1, seed, peer)[1])  # held: shared
    assert len(shards_seen) > 1  # rounds move the peer across shards


def test_targets_measured_together_give_the_integers_of_one_at_a_time() -> None:
    data = TextData.build(CONFIG.data, CONFIG.model)
    state = model_state(build_model(CONFIG))
    updates = _updates(state, 3, 3e-3)
    scoring = RoundScoring(CONFIG, data)
    seed = score_seed(["bafy-a", "bafy-b", "bafy-c"])
    together = scoring.measure_targets(2, seed, state, updates)
    assert sorted(together) == sorted(updates)
    if scoring.models.settled == 0:  # (a settled target takes the reference's four losses)
        assert len({losses[2] for losses in together.values()}) == 1  # one held "before" pass
    for peer, update in updates.items():
        alone = scoring.measure(2, seed, state, peer, update)
        assert all(
            abs(a - b) <= SCORE_LOSS_RTOL * abs(b)
            for a, b in zip(together[peer], alone, strict=True)
        )
        a, b = score_update(peer, *together[peer]), score_update(peer, *alone)
        assert (a.own, a.held, a.score) == (b.own, b.held, b.score)
    assert scoring.measure_targets(2, seed, state, {}) == {}
