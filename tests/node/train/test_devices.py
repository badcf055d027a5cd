"""Devices and precision (issue 26): `--device` selection, and bf16-mixed nodes in a fp32 run.

Local steps move to the node's device and precision; what other nodes check (aggregation, the
state, its CID) does not, so a run that mixes precisions keeps one state CID. Real trainers,
stores, signatures, scores and aggregation; "nodes" exchange blocks by copying them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
import torch

from cnode.auth import Identity, save_identity
from cnode.node._config import CONFIG_FILE, IDENTITY_FILE, load_config
from cnode.node._exceptions import ConfigError
from cnode.node.cli import main
from cnode.node.train import DeviceError, StopReason
from cnode.node.train._trainer import NodeTrainer
from cnode.node.train.model import Placement, TextData, build_model, resolve_device, train_local
from cnode.storage import BlockStore
from tests.support.trainers import play_full_round, tiny_config

NO_GPU = not torch.cuda.is_available() and not (
    getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
)
# A new run's table (scores on), small enough for a unit test.
CONFIG = tiny_config(scores=True)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: auto would pick it")
def test_auto_on_a_cpu_only_machine_picks_the_cpu_and_says_so() -> None:
    device, said = resolve_device("auto")
    assert device == torch.device("cpu")
    assert said == "auto: torch sees no GPU, picked cpu"
    assert Placement.resolve("auto", "bf16-mixed").precision == "bf16-mixed"


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("tpu", "unknown device 'tpu' (known: auto, cpu, cuda, cuda:N, mps)"),
        ("cuda:x", "unknown device 'cuda:x'"),
        ("", "unknown device ''"),
    ],
)
def test_an_unknown_device_is_refused_naming_it(spec: str, named: str) -> None:
    with pytest.raises(DeviceError) as info:
        resolve_device(spec)
    assert named in str(info.value)


def test_an_absent_device_is_a_clear_error() -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(DeviceError) as info:
        resolve_device(f"cuda:{count}")
    if count == 0:
        assert "torch sees no CUDA device" in str(info.value)
    else:
        assert f"torch sees {count} CUDA device(s)" in str(info.value)
    if NO_GPU:
        with pytest.raises(DeviceError, match="torch sees no MPS"):
            resolve_device("mps")
    with pytest.raises(DeviceError, match="precision 'fp8'"):
        Placement.resolve("cpu", "fp8")


def test_cnode_train_refuses_a_bad_device_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    save_identity(Identity.generate(), home / IDENTITY_FILE)
    run = tmp_path / "run.toml"
    run.write_text(tomli_w.dumps({"run": "r1", "coordinator": Identity.generate().peer_id_str}))
    args = ["train", "--home", str(home), "--run-config", str(run), "--run", "r1"]
    assert main([*args, "--device", "tpu"]) == StopReason.CONFIGURATION.exit_code
    assert "unknown device 'tpu'" in capsys.readouterr().err
    assert not (home / "blocks").exists()  # nothing stored
    (home / CONFIG_FILE).write_text('precision = "fp16"\n')
    with pytest.raises(ConfigError, match="precision must be one of"):
        load_config(home)


def test_bf16_mixed_steps_change_the_update_and_keep_float32() -> None:
    data = TextData.build(CONFIG.data, CONFIG.model)
    model = build_model(CONFIG)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    cpu = torch.device("cpu")
    fp32 = train_local(model, start, data, CONFIG, peer_id="p", round_=1,
                       placement=Placement(cpu, "fp32"))  # fmt: skip
    bf16 = train_local(model, start, data, CONFIG, peer_id="p", round_=1,
                       placement=Placement(cpu, "bf16-mixed"))  # fmt: skip
    assert all(t.dtype == torch.float32 and t.device == cpu for t in bf16.delta.values())
    assert any(not torch.equal(fp32.delta[n], bf16.delta[n]) for n in start)  # autocast ran
    assert abs(fp32.loss_first - bf16.loss_first) < 0.05  # the same data, a close loss


def test_a_run_mixing_precisions_admits_every_update_and_keeps_one_state_cid(
    tmp_path: Path,
) -> None:
    cpu = torch.device("cpu")
    precisions = ["fp32", "bf16-mixed", "bf16-mixed"]
    nodes = [
        NodeTrainer(
            CONFIG,
            run="r1",
            identity=Identity.generate(),
            store=BlockStore(tmp_path / f"n{i}"),
            placement=Placement(cpu, p),
        )
        for i, p in enumerate(precisions)
    ]
    for round_ in (1, 2):
        outcomes = play_full_round(nodes, round_)
        everyone = tuple(sorted(n.peer for n in nodes))
        assert all(o.members == everyone and not o.dropped for o in outcomes)
        assert len({n.state_cid for n in nodes}) == 1
    assert len({n.store_checkpoint() for n in nodes}) == 1
