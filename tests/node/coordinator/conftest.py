"""Fixtures: a real coordinator on 127.0.0.1 (in a thread with its own asyncio loop, or in its own
process), real SQLite files, real signed requests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from cnode.auth import Identity, seal
from cnode.node.coordinator import (
    REQUEST_TYPE,
    AccessConfig,
    RoundsConfig,
    RunConfig,
    SyncCoordinatorClient,
)
from cnode.node.coordinator._wire._protocol import b64encode
from cnode.node.coordinator.server import CoordinatorServer, ServeSettings


@dataclass
class Running:
    """A coordinator serving in a background thread."""

    server: CoordinatorServer
    url: str
    key: Identity
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def peer_id(self) -> str:
        return self.key.peer_id_str

    def client(self, identity: Identity) -> SyncCoordinatorClient:
        return SyncCoordinatorClient(
            self.url, run=self.server.run, coordinator=self.peer_id, identity=identity
        )

    def admin(self) -> SyncCoordinatorClient:
        return self.client(self.key)

    def state(self) -> dict[str, Any]:
        """The verified run state, minus its signing time (for before/after comparisons)."""
        with self.admin() as c:
            payload = c.run_state().to_payload()
        payload.pop("at_ms")
        return payload

    def stop(self) -> None:
        if not self.thread.is_alive():
            return  # stopped already (a test that restarts on the same database)
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


_counter = [time.time_ns() // 1000]


def body(
    identity: Identity,
    op: str,
    args: dict[str, Any] | None = None,
    *,
    run: str = "test-run",
    token: bytes | None = None,
    counter: int | None = None,
) -> dict:
    _counter[0] = max(_counter[0] + 1, time.time_ns() // 1000)
    payload: dict[str, Any] = {
        "run": run,
        "op": op,
        "counter": counter or _counter[0],
        "args": args or {},
    }
    if token is not None:
        payload["token"] = token
    return {"envelope": b64encode(seal(identity, REQUEST_TYPE, payload))}


def post(
    running: Running,
    op: str,
    json_body: Any = None,
    *,
    content: bytes | None = None,
    run: str = "test-run",
) -> httpx.Response:
    url = f"{running.url}/v1/runs/{run}/{op}"
    if content is not None:
        return httpx.post(url, content=content, headers={"content-type": "application/json"})
    return httpx.post(url, json=json_body)


def refused(response: httpx.Response, status: int, code: str, words: str) -> None:
    assert response.status_code == status, response.text
    j = response.json()
    assert j["error"] == code, j
    assert words in j["message"], j


def start_server(settings: ServeSettings) -> Running:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def make() -> tuple[CoordinatorServer, str]:
        server = CoordinatorServer(settings)
        return server, await server.start()

    server, url = asyncio.run_coroutine_threadsafe(make(), loop).result(30)
    return Running(server, url, settings.identity, loop, thread)


def run_config(
    peers: list[Identity], *, partitioned: str = "never", scores: bool = False, **rounds: Any
) -> RunConfig:
    """A test run; full replication unless ``partitioned`` says otherwise (``auto``, ``always``);
    without scores unless ``scores`` (with them, a partitioned round's result window waits for
    score records these tests mostly do not send)."""
    defaults: dict[str, Any] = {"min_participants": 2, "round_timeout_s": 30.0}
    return RunConfig(
        run="test-run",
        rounds=RoundsConfig(**(defaults | rounds)),
        access=AccessConfig(peers=[p.peer_id_str for p in peers]),
        training={"partitioned": partitioned, "scores": scores},
    )


@pytest.fixture
def peers() -> list[Identity]:
    return [Identity.generate() for _ in range(4)]


@pytest.fixture
def coordinator_key() -> Identity:
    return Identity.generate()


@pytest.fixture
def serve(tmp_path: Path, coordinator_key: Identity) -> Iterator[Callable[..., Running]]:
    """``serve(config)`` starts a coordinator on a fresh DB; all are stopped at the end."""
    started: list[Running] = []

    def start(config: RunConfig, *, db: Path | None = None, **settings: Any) -> Running:
        config = replace(config, coordinator=coordinator_key.peer_id_str)
        running = start_server(
            ServeSettings(
                config=config, db=db or tmp_path / "coord.db", identity=coordinator_key, **settings
            )
        )
        started.append(running)
        return running

    try:
        yield start
    finally:
        for running in started:
            running.stop()
