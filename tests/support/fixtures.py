"""pytest fixtures for identity / HF tests. Import the ones you use into your test module:

from tests.support.fixtures import hf_hub  # noqa: F401  (pytest finds it by name)
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.support.hf_hub import FakeHub


@pytest.fixture
def hf_hub() -> Iterator[FakeHub]:
    """A running FakeHub on 127.0.0.1; stopped when the test ends, whatever happened."""
    hub = FakeHub().start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def dead_endpoint() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
