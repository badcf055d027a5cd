"""``cnode train`` / ``cnode demo``: bad input gives one clear line and exit status 1; a node
that stops says why, from the closed set of StopReason, with that reason's exit status."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnode.node.cli import build_parser, main
from cnode.node.cli._demo import demo_settings
from cnode.node.coordinator import limits as coordinator_limits
from cnode.node.train import StopReason
from cnode.node.train._report import read_report
from tests.support.cli import node_home, run_config_file

CONFIGURATION = StopReason.CONFIGURATION.exit_code


def _train(home: Path, run_config: Path, *extra: str) -> list[str]:
    return ["train", "--home", str(home), "--run-config", str(run_config), *extra]


def test_unknown_attack_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = node_home(tmp_path)
    status = main(_train(home, run_config_file(tmp_path), "--run", "r1", "--attack", "bogus"))
    assert status == 1
    err = capsys.readouterr().err
    assert "unknown attack 'bogus'" in err and "gaussian" in err
    assert not (home / "blocks").exists()  # nothing stored


def test_run_id_must_match_the_run_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = node_home(tmp_path)
    assert main(_train(home, run_config_file(tmp_path), "--run", "other")) == CONFIGURATION
    err = capsys.readouterr().err
    assert "stopped (configuration): TrainingConfigError: --run 'other' but the run config" in err


def test_bad_training_table_names_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = node_home(tmp_path)
    config = run_config_file(tmp_path, training={"model": {"n_embd": 63}})
    assert main(_train(home, config, "--run", "r1")) == CONFIGURATION
    assert "n_embd must be a multiple of n_head" in capsys.readouterr().err


def test_demo_refuses_a_late_joiner_after_the_last_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--rounds", "3", "--late-after", "3"]) == 1
    err = capsys.readouterr().err
    assert "--late-after must be at least 1 and below --rounds (3), not 3" in err
    assert main(["demo", "--rounds", "1"]) == 1
    assert "--rounds must be >= 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "late"),
    [
        ([], 3),
        (["--rounds", "5"], 3),
        (["--rounds", "4"], 2),
        (["--rounds", "3"], 1),
        (["--rounds", "2"], 1),
        (["--rounds", "3", "--late-after", "1"], 1),
    ],
)
def test_the_demos_late_joiner_follows_the_rounds_asked_for(argv: list[str], late: int) -> None:
    args = build_parser().parse_args(["demo", *argv])
    assert demo_settings(args).late_after_round == late


def test_demo_and_train_refuse_an_unknown_update_codec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--codec", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err
    home = node_home(tmp_path)
    config = run_config_file(tmp_path, training={"update_codec": "int4"})
    assert main(_train(home, config, "--run", "r1")) == CONFIGURATION
    assert "update_codec 'int4' is not one of" in capsys.readouterr().err


def test_hf_repo_needs_the_checkpointer_and_a_hub_login(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = node_home(tmp_path)
    config = run_config_file(tmp_path)
    assert main(_train(home, config, "--run", "r1", "--hf-repo", "acme/x")) == 1
    assert "--hf-repo needs --checkpointer" in capsys.readouterr().err
    args = _train(home, config, "--run", "r1", "--hf-repo", "acme/x", "--checkpointer")
    assert main(args) == CONFIGURATION
    assert "needs a Hub login: run cnode init --hf-login" in capsys.readouterr().err
    (home / "hf_token").write_text("hf_abc")
    (home / "hf_token").chmod(0o644)
    assert main(args) == CONFIGURATION
    err = capsys.readouterr().err
    assert "readable by others" in err and "hf_abc" not in err


@pytest.mark.slow  # ~60 s idle: the client rides out COORDINATOR_OUTAGE_S before it gives up
def test_a_node_whose_coordinator_is_gone_stops_with_that_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node retries for COORDINATOR_OUTAGE_S (a restart takes seconds) before it stops;
    # the whole minute would show nothing more here (test_faults.py plays a real restart).
    monkeypatch.setattr(coordinator_limits, "COORDINATOR_OUTAGE_S", 2.0)
    home = node_home(tmp_path)
    config = run_config_file(tmp_path)
    report = tmp_path / "report.jsonl"
    args = _train(home, config, "--run", "r1", "--coordinator", "http://127.0.0.1:9", "--report")
    assert main([*args, str(report), "--listen", "/ip4/127.0.0.1/tcp/0"]) == 6
    assert StopReason.COORDINATOR.exit_code == 6
    assert "stopped (coordinator): CoordinatorUnavailable: cannot reach the coordinator" in (
        capsys.readouterr().err
    )
    (stopped,) = [e for e in read_report(report) if e["event"] == "stopped"]
    assert stopped["stop_reason"] == "coordinator" and stopped["exit_code"] == 6
