"""Config parsing, the default model, and local training."""

from __future__ import annotations

import pytest
import torch

from cnode.node.train import (
    TextData,
    TrainingConfig,
    TrainingConfigError,
    build_model,
    evaluate,
    model_state,
    train_local,
)


def test_empty_table_gives_the_tiny_default_model() -> None:
    config = TrainingConfig.for_run({})
    assert config == TrainingConfig()
    assert TrainingConfig.from_dict({}) == TrainingConfig(scores=False)  # a record before scores
    state = model_state(build_model(config))
    assert 100_000 < sum(t.numel() for t in state.values()) < 300_000
    assert all(t.dtype == torch.float32 for t in state.values())
    assert "lm_head.weight" not in state  # tied to transformer.wte.weight, stored once


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"bogus": 1}, "unknown setting"),
        ({"model": {"n_embd": 65}}, "multiple of n_head"),
        ({"local_steps": 0}, "local_steps"),
        ({"lr": "fast"}, "lr must be float"),
        ({"model": {"n_layer": True}}, "n_layer must be int"),
        ({"data": {"seq_len": 128}}, "seq_len must be <="),
        ({"model": {"n_embd": 65536, "n_head": 1}}, "MAX_MODEL_PARAMETERS"),
    ],
)
def test_bad_training_settings_are_clear_errors(raw: dict, message: str) -> None:
    with pytest.raises(TrainingConfigError, match=message):
        TrainingConfig.from_dict(raw)


def test_config_round_trips_through_a_dict() -> None:
    config = TrainingConfig.from_dict({"lr": 1, "aggregator_params": {"tau": 2.0}})
    assert config.lr == 1.0
    assert TrainingConfig.from_dict(config.to_dict()) == config


def test_same_seed_same_weights_and_updates_are_deterministic() -> None:
    config = TrainingConfig.from_dict({"local_steps": 3})
    a, b = model_state(build_model(config)), model_state(build_model(config))
    assert all(torch.equal(a[k], b[k]) for k in a)
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    r1 = train_local(model, a, data, config, peer_id="peerA", round_=1)
    r2 = train_local(model, a, data, config, peer_id="peerA", round_=1)
    assert all(torch.equal(r1.delta[k], r2.delta[k]) for k in a)
    assert r1.samples == 3 * config.batch_size
    assert any(float(t.abs().max()) > 0 for t in r1.delta.values())


@pytest.mark.slow
def test_a_few_rounds_of_local_training_lower_the_held_out_loss() -> None:
    config = TrainingConfig()
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    state = model_state(model)
    before = evaluate(model, state, data)
    for round_ in range(1, 4):
        delta = train_local(model, state, data, config, peer_id="peerA", round_=round_).delta
        state = {k: state[k] + delta[k] for k in state}
    assert evaluate(model, state, data) < before - 0.3
