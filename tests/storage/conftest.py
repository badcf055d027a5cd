from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from cnode.storage import BlockStore, CheckpointMeta


@pytest.fixture
def store(tmp_path: Path) -> BlockStore:
    return BlockStore(tmp_path / "store")


def snapshot(store: BlockStore) -> dict[str, str]:
    """Every file under blocks/ and pins/ with its hash: 'nothing stored was harmed'."""
    out = {}
    for folder in ("blocks", "pins"):
        for path in sorted((store.root / folder).rglob("*")):
            if path.is_file():
                out[str(path.relative_to(store.root))] = hashlib.sha256(
                    path.read_bytes()
                ).hexdigest()
    return out


def small_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(300, 1000, generator=g),  # 1.2 MB: two chunks
        "block.0.norm.bias": torch.randn(16, generator=g).to(torch.float16),
        "block.0.attn.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "steps": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }


def meta(**changes: object) -> CheckpointMeta:
    base: dict[str, object] = {"run_id": "run-a", "epoch": 1, "round": 2, "step": 30}
    base.update(changes)
    return CheckpointMeta(**base)  # type: ignore[arg-type]
