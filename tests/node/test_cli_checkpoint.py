"""``cnode checkpoint ...`` end to end through the real command line entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import torch

from cnode.node._config import load_config
from cnode.node.cli import main
from cnode.storage import CID, BlockStore, CheckpointMeta, read_manifest, save_checkpoint


def _store(home: Path) -> BlockStore:
    return BlockStore(load_config(home).blocks_dir(home))


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(300, 1000, generator=g),
        "head.bias": torch.randn(10, generator=g),
    }


@pytest.fixture(autouse=True)
def _reset_logging() -> object:
    # main() points structlog at the sys.stderr of its moment (capsys' stream in a test);
    # put the defaults back so a later test does not log into a closed stream.
    yield
    structlog.reset_defaults()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def saved(home: Path) -> str:
    meta = CheckpointMeta(run_id="run-a", round=4, model_config={"model_type": "x"})
    return str(save_checkpoint(_store(home), _state(), meta))


def test_verify_ok_json(home: Path, saved: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "verify", saved, "--json", "--home", str(home)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["manifest"] == saved and report["layers"] == 2
    assert report["round"] == 4 and report["faults"] == []
    view = read_manifest(_store(home), CID.parse(saved)).extra["unixfs"]
    assert report["unixfs"] == str(view)  # the directory `ipfs get` turns into a model folder


def test_verify_shows_the_unixfs_view(
    home: Path, saved: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoint", "verify", saved, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    view = read_manifest(_store(home), CID.parse(saved)).extra["unixfs"]
    assert "UnixFS view" in out and str(view) in out.replace("\n", "")


def test_verify_names_every_fault(
    home: Path, saved: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store(home)
    layer = read_manifest(store, CID.parse(saved)).layers[0]
    store.delete(layer.chunks[0])
    path = store.root / "blocks" / str(layer.chunks[1])[-3:-1] / str(layer.chunks[1])
    path.write_bytes(b"bad")
    assert main(["checkpoint", "verify", saved, "--home", str(home)]) == 1
    out = capsys.readouterr().out
    assert "2 fault(s)" in out and "FAILED" in out
    assert "block-missing" in out and "block-corrupt" in out
    assert main(["checkpoint", "verify", saved, "--json", "--home", str(home)]) == 1
    faults = json.loads(capsys.readouterr().out)["faults"]
    assert {f["cid"] for f in faults} == {str(layer.chunks[0]), str(layer.chunks[1])}


def test_bad_argument_is_one_line_error(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "verify", "Qmnotacid", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cnode: error: ") and "not a manifest CID" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("/ip4/999.1.1.1/tcp/1", "base address '999.1.1.1' is not IPv4"),
        ("/ip4/127.0.0.1/tcp/1", "it names no peer; end it with /p2p/PEER_ID"),
        ("/ip4/127.0.0.1/tcp/1/p2p/notapeer", "Invalid CID: notapeer"),
    ],
)
def test_fetch_says_what_is_wrong_with_a_peer_address(
    home: Path, address: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cid = "bafyreigsmzorphngqd5vcsdjnfwzkvczy4t3agavu3zm2wcze4wuvifebm"
    assert main(["checkpoint", "fetch", cid, "--peer", address, "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert err == f"cnode: error: bad peer address {address!r}: {message}\n"


def test_ls_export_import_car(
    home: Path, saved: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoint", "ls", "--json", "--home", str(home)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["cid"], r["round"], r["missing"]) for r in rows] == [(saved, 4, 0)]
    car = tmp_path / "out.car"
    assert main(["checkpoint", "export", saved, "--car", str(car), "--home", str(home)]) == 0
    assert main(["checkpoint", "verify", str(car), "--json"]) == 0
    capsys.readouterr()
    other = tmp_path / "other"
    assert main(["checkpoint", "import", str(car), "--home", str(other)]) == 0
    assert capsys.readouterr().out.strip() == saved
    assert main(["checkpoint", "ls", "--home", str(other)]) == 0
    assert "pinned" in capsys.readouterr().out
    assert main(["checkpoint", "gc", "--home", str(other)]) == 0
    assert "removed 0" in capsys.readouterr().out


def test_bad_car_import_exit_1(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.car"
    bad.write_bytes(b"\x05hello")
    assert main(["checkpoint", "import", str(bad), "--home", str(home)]) == 1
    assert "CAR" in capsys.readouterr().err
    assert main(["checkpoint", "verify", str(bad), "--json"]) == 1


def test_export_import_hf(
    home: Path, saved: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hf"
    assert main(["checkpoint", "export", saved, "--hf", str(out), "--home", str(home)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    capsys.readouterr()
    assert (
        main(["checkpoint", "import", "--hf", str(out), "--run-id", "hf", "--home", str(home)]) == 0
    )
    cid = capsys.readouterr().out.strip()
    assert cid.startswith("bafy")


def test_console_script(home: Path, saved: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cnode", "checkpoint", "verify", saved, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout


def test_verify_on_a_fresh_home_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "fresh"
    cid = "bafyreigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
    assert main(["checkpoint", "verify", cid, "--json", "--home", str(home)]) == 1
    faults = json.loads(capsys.readouterr().out)["faults"]
    assert [(f["kind"], f["cid"]) for f in faults] == [("manifest-missing", cid)]
    assert main(["checkpoint", "ls", "--home", str(home)]) == 0
    assert "no checkpoints" in capsys.readouterr().out
    assert not home.exists()


def test_home_under_a_file_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    for action in ("ls", "gc"):
        assert main(["checkpoint", action, "--home", str(tmp_path / "file" / "x")]) == 1
        err = capsys.readouterr().err
        assert err.startswith("cnode: error: cannot open the block store ") and "file/x" in err
        assert err.count("\n") == 1 and "Traceback" not in err


def test_export_to_a_missing_folder_is_one_line_error(
    home: Path, saved: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "dir" / "x.car"
    assert main(["checkpoint", "export", saved, "--car", str(out), "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert err == f"cnode: error: cannot write {out}: No such file or directory\n"


def test_import_hf_refuses_nonfinite_unless_allowed(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file({"w": torch.tensor([1.0, float("nan")])}, str(folder / "model.safetensors"))
    args = ["checkpoint", "import", "--hf", str(folder), "--home", str(home)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.endswith(
        "tensor model.safetensors:w holds 1 NaN/Inf values; import it anyway "
        "with --allow-nonfinite (allow_nonfinite=True)\n"
    )
    assert main([*args, "--allow-nonfinite"]) == 0
    assert "hf_nonfinite_tensor" in capsys.readouterr().err


@pytest.mark.parametrize(("rate", "message"), [("-1", "--rate must be >= 0"), ("1000", "got 1000")])
def test_serve_refuses_an_upload_cap_fetchers_would_drop(
    home: Path, rate: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cap under MIN_SOURCE_RATE would make every fetcher drop this holder as too slow."""
    assert main(["checkpoint", "serve", "--open", "--rate", rate, "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("cnode: error: --rate ") == 1 and message in err
    if rate == "1000":
        assert "at least MIN_SOURCE_RATE (16384 bytes/s)" in err


def test_serve_and_train_refuse_a_config_upload_cap_fetchers_would_drop(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home.mkdir()
    (home / "config.toml").write_text("upload_rate_bytes_per_s = 16383\n")
    assert main(["checkpoint", "serve", "--open", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert "cnode: error: upload_rate_bytes_per_s (config.toml) must be 0 (no cap) or at " in err
    assert "got 16383" in err
    run_config = str(home / "run.toml")  # never read: the cap is refused first
    assert main(["train", "--run", "r", "--run-config", run_config, "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert "cnode: error: upload_rate_bytes_per_s (config.toml) must be 0 (no cap)" in err
