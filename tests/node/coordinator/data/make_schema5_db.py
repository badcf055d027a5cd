"""Writes schema5.db: a coordinator database made by the code before issue 40 split the store.

Run once, from the repository root, with the code of that time (commit a9e4941):
``python -m tests.node.coordinator.data.make_schema5_db``. It drives a real coordinator over HTTP
through a partitioned round (results, `checked`, score records), a full round (`collected`), a
checkpoint, an allowlist change and an admin ban, then records the signed views the new store
must serve unchanged from that file (``schema5.json``). Keys come from fixed seeds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import trio

from cnode.auth import Identity
from cnode.node.coordinator import CoordinatorClient
from cnode.node.coordinator.server import ServeSettings
from cnode.storage import compute_cid
from tests.node.coordinator.conftest import run_config, start_server

HERE = Path(__file__).parent


def keys() -> tuple[Identity, list[Identity]]:
    coordinator = Identity.from_seed(b"issue-40 coordinator".ljust(32, b"."))
    peers = [Identity.from_seed(f"issue-40 peer {i}".encode().ljust(32, b".")) for i in range(4)]
    return coordinator, peers


def config():  # type: ignore[no-untyped-def]
    coordinator, peers = keys()
    cfg = run_config(peers, partitioned="auto", min_participants=3, round_timeout_s=3600.0)
    return replace(cfg, coordinator=coordinator.peer_id_str)


def _header(text: str) -> str:
    return str(compute_cid(text.encode(), 0x71))


def main() -> None:
    coordinator, peers = keys()
    tmp = Path(tempfile.mkdtemp())
    running = start_server(
        ServeSettings(config=config(), db=tmp / "coord.db", identity=coordinator)
    )

    async def drive() -> dict:
        clients = {
            p.peer_id_str: CoordinatorClient(
                running.url, run="test-run", coordinator=running.peer_id, identity=p
            )
            for p in peers[:3]
        }
        for c in clients.values():
            await c.join()
            assert await c.join_round() == 1
        for peer, c in clients.items():
            await c.ready(1, header=_header(f"update of {peer}"))
        first = next(iter(clients.values()))
        with trio.fail_after(10):
            info = await first.wait_members(1)
        for p, agg in enumerate(info.aggregators):
            await clients[agg].result(1, partition=p, header=_header(f"result {p}"))
        for c in clients.values():
            await c.checked(1, wrong=[])
        with trio.fail_after(10):
            await first.wait_agreed(1)
        await first.submit_checkpoint(epoch=0, round=1, manifest=_header("manifest 1"))
        admin = CoordinatorClient(
            running.url, run="test-run", coordinator=running.peer_id, identity=coordinator
        )
        await admin.admin("allowlist.add", kind="user", value="alice")
        await admin.admin("ban", peer=peers[3].peer_id_str, reason="fixture ban")
        views = {
            "round_1": (await first.round_info(1)).to_payload(),
            "checkpoints": [r.to_payload() for r in await first.checkpoints()],
        }
        for c in (*clients.values(), admin):
            await c.aclose()
        return views

    views = trio.run(drive)
    state = running.state()
    running.stop()
    shutil.copy(tmp / "coord.db", HERE / "schema5.db")
    views["round_1"].pop("at_ms", None)
    (HERE / "schema5.json").write_text(
        json.dumps({"state": state, **views}, indent=1, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    main()
