"""Fixtures for p2p tests: a multi-layer checkpoint and homes of holders that hold it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import trio

from cnode.storage import CID, BlockStore, CheckpointMeta, save_checkpoint
from tests.support.procs import Procs, procs


@dataclass(frozen=True)
class Checkpoint:
    tensors: dict[str, torch.Tensor]
    root: CID
    blocks: int


def make_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    # 12 layers of 1.2 MB (two chunks each, the second short) plus odd small ones: ~15 MB.
    tensors = {f"h.{i}.w": torch.randn(300_000, generator=gen) for i in range(12)}
    tensors["ln.b"] = torch.randn(777, generator=gen)
    tensors["emb"] = torch.randn(64, 1000, generator=gen).to(torch.bfloat16)
    return tensors


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    tensors = make_tensors()
    store = BlockStore(tmp_path_factory.mktemp("origin") / "blocks")
    root = save_checkpoint(store, tensors, CheckpointMeta(run_id="p2p-test"))
    return Checkpoint(tensors, root, sum(1 for _ in store.iter_cids()))


def holder_home(base: Path, name: str, ckpt: Checkpoint) -> Path:
    home = base / name
    save_checkpoint(BlockStore(home / "blocks"), ckpt.tensors, CheckpointMeta(run_id="p2p-test"))
    return home


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Procs]:
    with procs(tmp_path) as p:
        yield p


T = TypeVar("T")


async def _inline(fn: Callable[..., T], *args: Any, **_kwargs: Any) -> T:
    await trio.lowlevel.checkpoint()
    return fn(*args)


@pytest.fixture
def threads_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``trio.to_thread.run_sync`` work inline, so a MockClock cannot jump while it works."""
    monkeypatch.setattr(trio.to_thread, "run_sync", _inline)
