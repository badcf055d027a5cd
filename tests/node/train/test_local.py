"""Config parsing, the default model, and local training."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import tomli_w
import torch

from cnode.auth import Identity, save_identity
from cnode.node._config import IDENTITY_FILE
from cnode.node.cli import main
from cnode.node.train import (
    DataConfig,
    StopReason,
    TextData,
    TrainingConfig,
    TrainingConfigError,
    build_model,
    check_model_fits,
    evaluate,
    limits,
    memory_need,
    model_state,
    train_local,
)


def test_a_recorded_config_always_says_whether_it_scores() -> None:
    for scores in (True, False):
        config = TrainingConfig.for_run({"scores": scores})
        recorded = config.to_dict()
        assert recorded["scores"] is scores
        assert TrainingConfig.from_dict(recorded) == config
        assert TrainingConfig.for_run(recorded) == config
    assert TrainingConfig.for_run({}).scores is TrainingConfig().scores is True  # the one default
    # only a record from before scores were recorded lacks the key: those runs did not score
    assert TrainingConfig.from_dict({}).scores is False


def test_empty_table_gives_the_tiny_default_model() -> None:
    config = TrainingConfig.for_run({})
    assert config == TrainingConfig()
    # a record from before scores, the per-round shard assignment and kept inner moments: none
    assert TrainingConfig.from_dict({}) == TrainingConfig(
        scores=False, data=DataConfig(assignment="fixed"), inner_optimizer_state="fresh"
    )
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
        ({"model": {"n_embd": 65536, "n_head": 1}}, "MAX_MODEL_PARAMETERS_CEILING"),
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


def test_the_held_out_loss_is_one_pass_over_every_sequence_taken_a_few_at_a_time() -> None:
    """``evaluate`` runs EVAL_BATCH_SEQUENCES sequences a pass (bounded memory, issue 41); the
    loss it reports is still the mean over every held-out token, also when the last pass is
    short."""
    config = TrainingConfig.for_run(
        {"data": {"eval_sequences": 2 * limits.EVAL_BATCH_SEQUENCES + 3}}
    )
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    state = model_state(model)
    assert len(data.eval) % limits.EVAL_BATCH_SEQUENCES == 3

    with torch.no_grad():
        whole = float(model.eval()(input_ids=data.eval, labels=data.eval).loss)
    rows: list[int] = []
    model.register_forward_pre_hook(lambda _m, args, kwargs: rows.append(len(kwargs["input_ids"])),
                                    with_kwargs=True)  # fmt: skip
    assert evaluate(model, state, data) == pytest.approx(whole, rel=1e-5)
    assert rows == [limits.EVAL_BATCH_SEQUENCES, limits.EVAL_BATCH_SEQUENCES, 3]
    assert model.training  # left as training finds it


def test_a_model_over_the_machines_memory_is_refused_at_start_with_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ~6.4B parameters: under the ceiling, but 7 x 25.8 GB to train is more than this machine.
    model = {"n_layer": 32, "n_embd": 4096, "n_head": 32, "n_positions": 64, "vocab_size": 1024}
    config = TrainingConfig.from_dict({"model": model})
    need = memory_need(model_parameters := config.model.approx_parameters())
    assert 6e9 < model_parameters < limits.MAX_MODEL_PARAMETERS_CEILING
    with pytest.raises(TrainingConfigError, match=r"does not fit this machine.*GB is available"):
        check_model_fits(config)
    with pytest.raises(
        TrainingConfigError,
        match=r"~6,447M parameters need 181.05 GB to train \(7 whole-model buffers\)",
    ):
        check_model_fits(config, available=need.peak_bytes - 1)
    assert check_model_fits(config, available=need.peak_bytes) == need
    # The same through `cnode train`: one line with the figures, before any network or model.
    home = tmp_path / "home"
    home.mkdir()
    save_identity(Identity.generate(), home / IDENTITY_FILE)
    run = tmp_path / "run.toml"
    raw = {
        "run": "r1",
        "coordinator": Identity.generate().peer_id_str,
        "training": {"model": model},
    }
    run.write_text(tomli_w.dumps(raw), encoding="utf-8")
    started = time.monotonic()
    assert main(["train", "--home", str(home), "--run-config", str(run), "--run", "r1"]) == (
        StopReason.CONFIGURATION.exit_code
    )
    err = capsys.readouterr().err
    assert "does not fit this machine" in err and "to train" in err and "Traceback" not in err
    assert time.monotonic() - started < 10.0


def test_a_network_supplied_size_over_the_ceiling_is_refused_before_allocation() -> None:
    # 1e12 parameters (4 TB): refused while the dict is read, so nothing of that size exists.
    rss = psutil.Process().memory_info().rss
    raw = {"model": {"n_layer": 1000, "n_embd": 8192, "n_head": 64}}
    with pytest.raises(TrainingConfigError, match="MAX_MODEL_PARAMETERS_CEILING"):
        TrainingConfig.for_run(raw)
    assert psutil.Process().memory_info().rss - rss < 64 << 20
