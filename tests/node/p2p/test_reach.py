"""Nobody dials what cannot be dialed (issue 37, specs/blocks.md#reachability): a holder marked
outbound-only, or one a dial to failed, is not dialed by a fetch while not connected; once it
dials us, its blocks come over its own connection. Real nodes on loopback in one process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from cnode.auth import Identity
from cnode.node.p2p import FetchError, P2PSettings, open_p2p_node
from cnode.storage import BlockStore

LOOPBACK = P2PSettings(listen=("/ip4/127.0.0.1/tcp/0",))


def test_an_outbound_only_holder_is_not_dialed_but_serves_over_its_own_connection(
    tmp_path: Path,
) -> None:
    holder = BlockStore(tmp_path / "holder")
    cid = holder.put_new(b"an outbound-only member's block")
    store = BlockStore(tmp_path / "fetcher")

    async def main() -> None:
        b_id = Identity.generate()
        b_peer = b_id.peer_id_str
        async with (
            open_p2p_node(b_id, holder, LOOPBACK, allow=bool) as b,
            open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as a,
        ):
            a.reach.mark_outbound_only({b_peer}, set())
            assert a.reach.why_not(b_peer) is not None
            began = time.monotonic()
            with pytest.raises(FetchError, match="could not be fetched"):
                await a.fetch_blocks([cid], [b_peer])
            assert time.monotonic() - began < 1.0  # refused at once: nothing was dialed
            assert a.reach.dials_avoided >= 1 and not a.connected_peers()
            # b dials a (as an outbound-only member dials the public ones): a fetches over it.
            with trio.fail_after(20):
                await b.connect(a.listen_addrs[0])
                report = await a.fetch_blocks([cid], [b_peer])
            assert report.blocks == 1

    trio.run(main)
    assert store.has(cid)


def test_a_failed_dial_is_remembered_and_a_listed_address_clears_it(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "fetcher")
    gone = Identity.generate().peer_id_str  # a peer with no address anywhere: its dial fails

    async def main() -> None:
        async with open_p2p_node(Identity.generate(), store, LOOPBACK, allow=bool) as a:
            cid = store.put_new(b"held here; the fetch asks for one we lack")
            missing = BlockStore(tmp_path / "other").put_new(b"nobody has this one")
            assert store.has(cid)
            with trio.fail_after(30), pytest.raises(FetchError):
                await a.fetch_blocks([missing], [gone])
            assert a.reach.why_not(gone) is not None, "the failed dial is remembered"
            avoided = a.reach.dials_avoided
            with trio.fail_after(5), pytest.raises(FetchError):
                await a.fetch_blocks([missing], [gone])
            assert a.reach.dials_avoided > avoided  # not dialed again
            a.reach.mark_outbound_only(set(), {gone})  # the coordinator lists it with an address
            assert a.reach.why_not(gone) is None

    trio.run(main)
