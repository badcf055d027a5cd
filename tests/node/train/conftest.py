"""One torch thread per test here (the machine is shared, and two threads per process fight), and
the swarms a test starts, each closed at its end whatever happened."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from .swarm import Swarm


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def swarms() -> Iterator[list[Swarm]]:
    """Append each Swarm you start; every one is closed (its processes stopped) at the end."""
    made: list[Swarm] = []
    try:
        yield made
    finally:
        for swarm in made:
            swarm.close()
