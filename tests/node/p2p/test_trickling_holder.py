"""A real libp2p holder that trickles the right bytes (issue 29, item 4; specs/blocks.md 13a).

Three real nodes on loopback in one process: a fetcher, an honest holder and a trickler, whose
upload cap (``P2PSettings.upload_rate_bytes_per_s``, the token bucket of ``cnode checkpoint
serve --rate``) sends whole, correct blocks far under MIN_SOURCE_RATE. The no-progress timer and
both end-game moves are switched off here, so only the minimum-rate rule can drop the trickler:
without it the fetch would wait on the trickler's share (about 12 blocks x 8 s).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from cnode.auth import Identity
from cnode.node.p2p import FetchError, FetchReport, P2PSettings, limits, open_p2p_node
from cnode.storage import CID, BlockStore

LOOPBACK = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))
BLOCK = 16 * 1024
TRICKLE_RATE = 2000  # bytes/s after the bucket's 64 KiB burst: one block per ~8 s
WINDOW_S = 2.0


@pytest.fixture
def only_the_rate_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "SOURCE_RATE_WINDOW_S", WINDOW_S)
    monkeypatch.setattr(limits, "MIN_SOURCE_RATE", 8000)
    monkeypatch.setattr(limits, "NO_PROGRESS_TIMEOUT_S", 1e9)
    monkeypatch.setattr(limits, "STEAL_MIN_OBSERVED_S", 1e9)
    # The end game's other move, the back half of a request that is not much slower, is left
    # alone under MIN_SPLIT_BYTES; these blocks' sizes are unknown to the fetcher (1 MiB each to
    # the batching rule), so only a bound no tail reaches switches it off. Requests are then
    # BATCH_BLOCKS each, as before the byte rule.
    monkeypatch.setattr(limits, "MIN_SPLIT_BYTES", 1 << 40)


def _blocks(store: BlockStore, n: int) -> list[CID]:
    return [store.put_new(i.to_bytes(4, "big") * (BLOCK // 4)) for i in range(n)]


async def _fetch(
    store: BlockStore, cids: list[CID], holders: list[tuple[Identity, BlockStore, float]]
) -> FetchReport:
    """Serve each ``(identity, store, upload rate)`` from its own node; fetch from all."""
    async with trio.open_nursery() as nursery:
        nodes = []
        for identity, held, rate in holders:
            settings = P2PSettings(listen=LOOPBACK.listen, upload_rate_bytes_per_s=rate)
            nodes.append(await nursery.start(_serve, identity, held, settings))
        try:
            async with open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as fetcher:
                with trio.fail_after(60):
                    for address in nodes:
                        await fetcher.connect(address)
                    peers = [h[0].peer_id_str for h in holders]
                    report: FetchReport | FetchError = await fetcher.fetch_blocks(cids, peers)
        except FetchError as exc:  # raised bare below, not inside the nursery's group
            report = exc
        finally:
            nursery.cancel_scope.cancel()  # the holders stop once the fetcher is closed
    if isinstance(report, FetchError):
        raise report
    return report


async def _serve(
    identity: Identity,
    store: BlockStore,
    settings: P2PSettings,
    task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with open_p2p_node(identity, store, settings, allow=bool) as node:
        task_status.started(node.listen_addrs[0])
        await trio.sleep_forever()


@pytest.mark.usefixtures("only_the_rate_rule")
def test_a_trickling_libp2p_holder_beside_an_honest_one_is_dropped(tmp_path: Path) -> None:
    held = BlockStore(tmp_path / "held")
    cids = _blocks(held, 64)
    honest, trickler = Identity.generate(), Identity.generate()
    alone_start = time.monotonic()
    trio.run(_fetch, BlockStore(tmp_path / "alone"), cids, [(honest, held, 0.0)])
    alone_s = time.monotonic() - alone_start

    store = BlockStore(tmp_path / "fetcher")
    start = time.monotonic()
    report = trio.run(_fetch, store, cids, [(trickler, held, TRICKLE_RATE), (honest, held, 0.0)])
    took = time.monotonic() - start
    assert report.blocks == len(cids)
    assert all(store.check(c)[0] == "ok" for c in cids)
    reason = report.dropped[trickler.peer_id_str]  # keyed by the whole peer id
    assert reason.startswith("too slow:") and "MIN_SOURCE_RATE" in reason, reason
    assert honest.peer_id_str not in report.dropped
    # The honest holder's own time, plus the trickler's burst window and the window it is
    # dropped in (each checked a quarter window late at most), plus slack for a loaded
    # machine; the trickler's share alone would take ~100 s.
    assert took < alone_s + 3 * WINDOW_S + 10, (took, alone_s)


@pytest.mark.usefixtures("only_the_rate_rule")
def test_a_fetch_whose_only_holder_trickles_fails_naming_it(tmp_path: Path) -> None:
    held = BlockStore(tmp_path / "held")
    cids = _blocks(held, 16)
    trickler = Identity.generate()
    start = time.monotonic()
    with pytest.raises(FetchError, match="could not be fetched") as info:
        trio.run(_fetch, BlockStore(tmp_path / "fetcher"), cids, [(trickler, held, TRICKLE_RATE)])
    assert time.monotonic() - start < 3 * WINDOW_S + 10
    assert f"'{trickler.peer_id_str}': 'too slow:" in str(info.value)
