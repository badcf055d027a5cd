"""Real hosts in separate processes on 127.0.0.1: holders (`cnode checkpoint serve`) and a
joiner (`cnode checkpoint fetch`). Every process is stopped by the `running` fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cnode.storage import CID, BlockStore, CheckpointMeta, load_checkpoint, save_checkpoint
from tests.support.procs import Procs, wait_until

from .conftest import Checkpoint, holder_home

CORRUPT = {"CNODE_TESTING_CORRUPT_UPLOADS": "1"}


def _peer(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


def _assert_same(store: BlockStore, ckpt: Checkpoint) -> None:
    tensors, _manifest = load_checkpoint(store, ckpt.root)
    assert tensors.keys() == ckpt.tensors.keys()
    for name, tensor in ckpt.tensors.items():
        assert torch.equal(tensors[name], tensor), name


def _wait_blocks(home: Path, n: int) -> None:
    blocks = home / "blocks"

    def enough() -> bool:
        return blocks.exists() and sum(1 for _ in BlockStore(blocks).iter_cids()) >= n

    wait_until(enough, f"{n} blocks in {blocks}")


def _fetch(running: Procs, home: Path, ckpt: Checkpoint, addrs: list[str]):  # type: ignore[no-untyped-def]
    args = ["checkpoint", "fetch", str(ckpt.root), "--home", str(home), "--quiet"]
    for addr in addrs:
        args += ["--peer", addr]
    return running.start(*args)


@pytest.mark.slow
def test_three_holders_one_joiner(tmp_path: Path, checkpoint: Checkpoint, running: Procs) -> None:
    homes = [holder_home(tmp_path, f"h{i}", checkpoint) for i in range(3)]
    addrs = [addr for _p, addr in running.holders(homes, "--open", "--rate", "4000000")]
    joiner = tmp_path / "joiner"
    fetch = _fetch(running, joiner, checkpoint, addrs)
    assert fetch.wait(60) == 0, fetch.describe()
    summary = next(line for line in fetch.stdout if line.startswith("fetched "))
    assert f"{checkpoint.blocks} blocks" in summary
    assert "from 3 holders" in summary, summary
    _assert_same(BlockStore(joiner / "blocks"), checkpoint)


@pytest.mark.slow
def test_holder_killed_mid_transfer(tmp_path: Path, checkpoint: Checkpoint, running: Procs) -> None:
    homes = [holder_home(tmp_path, f"h{i}", checkpoint) for i in range(3)]
    holders = running.holders(homes, "--open", "--rate", "1500000")
    joiner = tmp_path / "joiner"
    fetch = _fetch(running, joiner, checkpoint, [addr for _proc, addr in holders])
    _wait_blocks(joiner, 6)
    assert fetch.proc.poll() is None, "fetch finished before the kill: make the test slower"
    holders[0][0].kill()
    assert fetch.wait(60) == 0, fetch.describe()
    _assert_same(BlockStore(joiner / "blocks"), checkpoint)
    dropped = [e for e in fetch.log_events() if e.get("event") == "holder_dropped"]
    assert [e["holder"] for e in dropped] == [_peer(holders[0][1])]


@pytest.mark.slow
def test_corrupting_holder_is_dropped_and_reported(
    tmp_path: Path, checkpoint: Checkpoint, running: Procs
) -> None:
    bad_proc, bad = running.holder(holder_home(tmp_path, "bad", checkpoint), "--open", env=CORRUPT)
    homes = [holder_home(tmp_path, f"g{i}", checkpoint) for i in range(2)]
    good = [addr for _p, addr in running.holders(homes, "--open", "--rate", "3000000")]
    joiner = tmp_path / "joiner"
    fetch = _fetch(running, joiner, checkpoint, [bad, *good])
    assert fetch.wait(60) == 0, fetch.describe()
    store = BlockStore(joiner / "blocks")
    assert all(store.check(cid)[0] == "ok" for cid in store.iter_cids())
    assert not any((store.root / "quarantine").glob("*"))
    _assert_same(store, checkpoint)
    reports = [e for e in fetch.log_events() if e.get("event") == "holder_sent_bad_block"]
    assert reports and all(e["holder"] == _peer(bad) for e in reports)
    assert reports[0]["claimed"] != reports[0]["computed"]
    assert f"dropped holder {_peer(bad)}: bad bytes" in "\n".join(fetch.stdout)
    assert any(e.get("event") == "TESTING_AID_corrupting_uploads" for e in bad_proc.log_events())


@pytest.mark.slow
def test_all_holders_gone_keeps_progress_then_resumes(
    tmp_path: Path, checkpoint: Checkpoint, running: Procs
) -> None:
    homes = [holder_home(tmp_path, f"h{i}", checkpoint) for i in range(2)]
    holders = running.holders(homes, "--open", "--rate", "1000000")
    joiner = tmp_path / "joiner"
    fetch = _fetch(running, joiner, checkpoint, [addr for _proc, addr in holders])
    _wait_blocks(joiner, 6)
    for proc, _addr in holders:
        proc.kill()
    assert fetch.wait(60) == 1
    error = fetch.log_path.read_text()
    assert "cnode: error: " in error and "could not be fetched from any holder" in error
    assert "Traceback" not in error
    store = BlockStore(joiner / "blocks")
    kept = sum(1 for _ in store.iter_cids())
    assert 0 < kept < checkpoint.blocks
    assert all(store.check(cid)[0] == "ok" for cid in store.iter_cids())

    _proc, addr = running.holder(homes[0], "--open")
    again = _fetch(running, joiner, checkpoint, [addr])
    assert again.wait(60) == 0, again.describe()
    summary = next(line for line in again.stdout if line.startswith("fetched "))
    assert f"{checkpoint.blocks - kept} blocks" in summary, summary
    _assert_same(store, checkpoint)


@pytest.mark.slow
def test_joiner_killed_mid_fetch_leaves_no_corrupt_block_and_resumes(
    tmp_path: Path, checkpoint: Checkpoint, running: Procs
) -> None:
    """specs/blocks.md#durability: the fetch's blocks are fsynced as one batch; a joiner killed
    before the batch's sync leaves its marker, and the next open of the store checks them."""
    home = holder_home(tmp_path, "h0", checkpoint)
    _proc, addr = running.holder(home, "--open", "--rate", "1500000")
    joiner = tmp_path / "joiner"
    fetch = _fetch(running, joiner, checkpoint, [addr])
    _wait_blocks(joiner, 6)
    fetch.kill()
    assert len(list((joiner / "blocks" / "unsynced").iterdir())) == 1  # the batch's marker
    again = _fetch(running, joiner, checkpoint, [addr])  # opens the store: checks, resumes
    assert again.wait(60) == 0, again.describe()
    store = BlockStore(joiner / "blocks")
    assert list((store.root / "unsynced").iterdir()) == []
    assert not any((store.root / "quarantine").glob("*"))
    assert all(store.check(cid)[0] == "ok" for cid in store.iter_cids())
    _assert_same(store, checkpoint)
    checked = [e for e in again.log_events() if e.get("event") == "unsynced_batch_checked"]
    assert len(checked) == 1 and checked[0]["checked"] >= 6 and checked[0]["quarantined"] == 0


@pytest.mark.slow
def test_slow_holder_does_not_hold_up_the_end(
    tmp_path: Path, checkpoint: Checkpoint, running: Procs
) -> None:
    """Two holders at 4 MB/s, one at 150 kB/s: its unsent blocks move to the fast ones.

    Without moving work, the slow holder's share (~5 MB of the ~15 MB) alone takes ~30 s.
    """
    fast = running.holders(
        [holder_home(tmp_path, f"f{i}", checkpoint) for i in range(2)],
        "--open",
        "--rate",
        "4000000",
    )
    _slow_proc, slow = running.holder(
        holder_home(tmp_path, "slow", checkpoint), "--open", "--rate", "150000"
    )
    joiner = tmp_path / "joiner"
    fetch = _fetch(running, joiner, checkpoint, [slow, *(addr for _p, addr in fast)])
    assert fetch.wait(60) == 0, fetch.describe()
    summary = next(line for line in fetch.stdout if line.startswith("fetched "))
    seconds = float(summary.split(" in ")[1].split(" s ")[0])
    assert seconds < 7, summary  # ideal ~1.8 s; without moving work ~12 s (no-progress drop)
    _assert_same(BlockStore(joiner / "blocks"), checkpoint)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "--peer",
                "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWHFd1gyNYFqxt7ke9FY2VoVVWY2XSPhvL9vg2pB6wQGfa",
            ],
            "none of the 1 peers could be reached",
        ),
        (["--peer", "/not/a/multiaddr"], "bad peer address '/not/a/multiaddr': unknown protocol"),
        ([], "no peers to fetch from"),
    ],
)
def test_fetch_cli_errors_are_one_line(
    tmp_path: Path, checkpoint: Checkpoint, running: Procs, args: list[str], message: str
) -> None:
    home = tmp_path / "joiner"
    proc = running.start("checkpoint", "fetch", str(checkpoint.root), "--home", str(home), *args)
    assert proc.wait(60) == 1
    log = proc.log_path.read_text()
    assert f"cnode: error: {message}" in log
    assert "Traceback" not in log
    assert not (home / "blocks" / "blocks").exists() or not any(
        (home / "blocks" / "blocks").iterdir()
    )


def test_fetch_cli_bad_cid(tmp_path: Path, running: Procs) -> None:
    proc = running.start("checkpoint", "fetch", "bafynotacid", "--home", str(tmp_path))
    assert proc.wait(60) == 1
    assert "cnode: error: 'bafynotacid' is not a CID" in proc.log_path.read_text()


def _small_checkpoint(tmp_path: Path, nbytes: int) -> tuple[Path, CID, int]:
    """A holder home with one float32 layer of ``nbytes``; its root and block bytes."""
    home = tmp_path / "holder"
    store = BlockStore(home / "blocks")
    tensor = torch.arange(nbytes // 4, dtype=torch.float32)
    root = save_checkpoint(store, {"w": tensor}, CheckpointMeta(run_id="rate-test"))
    return home, root, sum(store.size(cid) for cid in store.iter_cids())


@pytest.mark.slow
def test_upload_rate_cap_holds_end_to_end(tmp_path: Path, running: Procs) -> None:
    """A holder capped at 1 MB/s serves 2 MB in about 2 s (uncapped on loopback: ~0.05 s)."""
    rate = 1_000_000
    home, root, total = _small_checkpoint(tmp_path, 2_000_000)
    _proc, addr = running.holder(home, "--open", "--rate", str(rate))
    joiner = tmp_path / "joiner"
    fetch = running.start(
        "checkpoint", "fetch", str(root), "--home", str(joiner), "--quiet", "--peer", addr
    )
    assert fetch.wait(60) == 0, fetch.describe()
    summary = next(line for line in fetch.stdout if line.startswith("fetched "))
    seconds = float(summary.split(" in ")[1].split(" s ")[0])
    # The bucket lets a burst of rate / 10 through at once; the rest waits for tokens.
    floor = (total - rate / 10) / rate * 0.85
    assert floor >= 1.5
    assert floor <= seconds < 10 * total / rate, summary
    # 2 chunks + manifest + the UnixFS view (safetensors header, file node, directory)
    assert sum(1 for _ in BlockStore(joiner / "blocks").iter_cids()) == 3 + 3


def test_every_log_line_carries_the_own_peer(tmp_path: Path, running: Procs) -> None:
    """serve and fetch bind their own peer id to the log context; the remote side of a
    served request is ``requester``, so it never hides the own ``peer``."""
    home, root, _total = _small_checkpoint(tmp_path, 100_000)
    holder, addr = running.holder(home, "--open")
    fetch = running.start(
        "checkpoint", "fetch", str(root), "--home", str(tmp_path / "j"), "--quiet", "--peer", addr
    )
    assert fetch.wait(60) == 0, fetch.describe()
    fetched = fetch.log_events()
    assert fetched and {e.get("peer") for e in fetched} == {fetched[0]["peer"]}, fetched
    joiner = fetched[0]["peer"]
    assert joiner != _peer(addr)[-8:]
    holder.stop()
    served = holder.log_events()
    assert served and all(e.get("peer") == _peer(addr)[-8:] for e in served), served
    assert any(e["event"] == "ephemeral_identity" for e in served)
    stopped = next(e for e in served if e["event"] == "serve_stopped")
    assert stopped["requests"] >= 1
