"""A database written before issue 40 split the store (``data/schema5.db``, made by
``data/make_schema5_db.py`` with the code of that time) is opened by today's store and served
unchanged: the signed run state, round record and checkpoint history equal what that code
served (``data/schema5.json``), and the run goes on (a new round opens to the same peers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from cnode.node.coordinator import CoordinatorClient, CoordinatorRejected
from cnode.node.coordinator.server import ServeSettings

from .conftest import start_server
from .data.make_schema5_db import config, keys

DATA = Path(__file__).parent / "data"


def _served(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    db = tmp_path / "coord.db"
    shutil.copy(DATA / "schema5.db", db)
    coordinator, _peers = keys()
    running = start_server(ServeSettings(config=config(), db=db, identity=coordinator))
    return running, json.loads((DATA / "schema5.json").read_text())


def _client(running: Any, identity: Any) -> CoordinatorClient:
    return CoordinatorClient(
        running.url, run="test-run", coordinator=running.peer_id, identity=identity
    )


def test_an_old_database_is_served_unchanged(tmp_path: Path) -> None:
    running, before = _served(tmp_path)
    try:
        assert running.state() == before["state"]

        async def main() -> None:
            async with _client(running, running.key) as c:
                info = (await c.round_info(1)).to_payload()
                info.pop("at_ms", None)
                assert info == before["round_1"]
                assert [r.to_payload() for r in await c.checkpoints()] == before["checkpoints"]

        trio.run(main)
        with running.admin() as admin:
            assert {"kind": "user", "value": "alice"} in [
                {"kind": e["kind"], "value": e["value"]} for e in admin.allowlist()
            ]
            kinds = [e["kind"] for e in admin.log()]
            assert kinds.count("ban") == 1 and kinds.count("round_agreed") == 1
    finally:
        running.stop()


def test_an_old_database_goes_on(tmp_path: Path) -> None:
    running, before = _served(tmp_path)
    _coordinator, peers = keys()
    try:

        async def main() -> None:
            async with _client(running, peers[0]) as c:
                await c.join()
                assert await c.join_round() == before["state"]["round"]["round"]
            async with _client(running, peers[3]) as c:  # the fixture's admin ban stands
                with pytest.raises(CoordinatorRejected) as caught:
                    await c.join()
                assert caught.value.code == "banned"

        trio.run(main)
    finally:
        running.stop()
