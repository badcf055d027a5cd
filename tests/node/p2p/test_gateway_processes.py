"""Real processes: a cnode holder's gateway serves a checkpoint; a second node fetches it
through ``--gateway`` (alone and mixed with ``--peer``); an IPFS tool unpacks the gateway's CAR
of the UnixFS view into a folder ``from_pretrained`` loads. Every process is stopped by the
``running`` fixture."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch

from cnode.storage import (
    BlockStore,
    CheckpointMeta,
    load_checkpoint,
    read_manifest,
    recorded_unixfs_root,
    save_checkpoint,
    verify_checkpoint,
)
from tests.support.js import unpack_car
from tests.support.procs import CnodeProc, Procs

from .conftest import Checkpoint, holder_home


def _gateway(running: Procs, home: Path, *extra: str) -> tuple[CnodeProc, str, str]:
    """A holder with ``--gateway 127.0.0.1:0``: (proc, libp2p multiaddr, gateway URL)."""
    proc, addr = running.holder(home, "--open", "--gateway", "127.0.0.1:0", *extra)
    url = proc.wait_line("gateway ").split(" ", 1)[1]
    return proc, addr, url


def _same(home: Path, ckpt: Checkpoint) -> None:
    store = BlockStore(home / "blocks")
    assert verify_checkpoint(store, ckpt.root).ok
    tensors, _ = load_checkpoint(store, ckpt.root)
    assert all(torch.equal(tensors[k], v) for k, v in ckpt.tensors.items())


def test_second_node_fetches_through_the_holders_gateway(
    tmp_path: Path, checkpoint: Checkpoint, running: Procs
) -> None:
    holder, _addr, url = _gateway(running, holder_home(tmp_path, "h", checkpoint))
    joiner = tmp_path / "joiner"
    fetch = running.start(
        "checkpoint", "fetch", str(checkpoint.root), "--home", str(joiner), "--quiet",
        "--gateway", url,
    )  # fmt: skip
    assert fetch.wait(60) == 0, fetch.describe()
    assert any(line.startswith(f"fetched {checkpoint.root}") for line in fetch.stdout)
    _same(joiner, checkpoint)
    assert any(e.get("event") == "gateway_open" for e in holder.log_events())


def test_gateway_and_peer_holders_share_one_fetch(
    tmp_path: Path, checkpoint: Checkpoint, running: Procs
) -> None:
    _g, _a, url = _gateway(running, holder_home(tmp_path, "g", checkpoint))
    _p, addr = running.holder(holder_home(tmp_path, "p", checkpoint), "--open")
    joiner = tmp_path / "joiner"
    fetch = running.start(
        "checkpoint", "fetch", str(checkpoint.root), "--home", str(joiner), "--quiet",
        "--gateway", url, "--peer", addr, "--gateway-format", "car",
    )  # fmt: skip
    assert fetch.wait(60) == 0, fetch.describe()
    summary = next(line for line in fetch.stdout if line.startswith("fetched "))
    assert summary.endswith("from 2 holders"), summary
    _same(joiner, checkpoint)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--allow-peer", "12D3KooWxyz", "--gateway", "127.0.0.1:0"], "give --open"),
        (["--open", "--gateway", "localhost"], "--gateway must be HOST:PORT"),
    ],
)
def test_serve_gateway_refuses_bad_options(
    tmp_path: Path, running: Procs, args: list[str], message: str
) -> None:
    proc = running.start("checkpoint", "serve", "--home", str(tmp_path / "h"), *args)
    assert proc.wait(30) == 1
    assert message in proc.log_path.read_text()


def test_fetch_refuses_a_gateway_that_is_no_url(tmp_path: Path, running: Procs) -> None:
    cid = "bafyreibwuu2nkgx33dnkjvsqb3gzo77r4cnsepfcncjaokjbjvnzznwrx4"
    proc = running.start(
        "checkpoint", "fetch", cid, "--home", str(tmp_path), "--gateway", "ftp://x"
    )
    assert proc.wait(30) == 1
    assert "gateway must be an http:// or https:// URL" in proc.log_path.read_text()


@pytest.mark.slow
def test_ipfs_tool_unpacks_the_gateways_car_into_a_folder_from_pretrained_loads(
    tmp_path: Path, running: Procs
) -> None:
    transformers = pytest.importorskip("transformers")
    from tests.storage.test_hf import _tiny_gpt2, _tokenizer_files

    model, config = _tiny_gpt2()
    files = _tokenizer_files(tmp_path / "tok")
    home = tmp_path / "holder"
    store = BlockStore(home / "blocks")
    meta = CheckpointMeta(run_id="r", model_config=config.to_dict(), tokenizer_files=files)
    root = save_checkpoint(store, model.state_dict(), meta)
    directory = recorded_unixfs_root(read_manifest(store, root).extra)
    _proc, _addr, url = _gateway(running, home)
    response = httpx.get(f"{url}/ipfs/{directory}?format=car", timeout=30)
    assert response.status_code == 200
    car = tmp_path / "view.car"
    car.write_bytes(response.content)
    out = tmp_path / "ipfs-get"
    result = unpack_car(car, str(directory), out)
    assert sorted(result["files"]) == sorted(["config.json", "model.safetensors", *files])
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = torch.tensor([[1, 5, 7, 42, 99, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


@pytest.mark.slow
def test_gateway_uploads_go_through_the_holders_rate_cap(tmp_path: Path, running: Procs) -> None:
    """The holder's --rate caps its gateway too: 2 MB at 1 MB/s take about 2 s."""
    from .test_fetch_processes import _small_checkpoint

    rate = 1_000_000
    home, root, _total = _small_checkpoint(tmp_path, 2_000_000)
    _proc, _addr, url = _gateway(running, home, "--rate", str(rate))
    began = time.monotonic()
    response = httpx.get(f"{url}/ipfs/{root}?format=car", timeout=60)
    seconds = time.monotonic() - began
    assert response.status_code == 200 and len(response.content) > 2_000_000
    floor = (len(response.content) - rate / 10) / rate * 0.85  # the bucket's burst goes at once
    assert floor >= 1.5
    assert floor <= seconds < 10 * len(response.content) / rate, seconds
