"""The run's update-header topic between real libp2p hosts (specs/training.md#interaction, step 4;
specs/announce.md rule 3): a header is published once, and it tells every receiver that its
signer holds the update it names, with no ``update`` announcement beside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from cnode.auth import Identity
from cnode.node.p2p import P2PSettings, open_p2p_node
from cnode.node.train._round import UpdateHeader, seal_update_header
from cnode.node.train.swarm._headers import HeaderCollector
from cnode.node.train.swarm._topics import RunTopics, updates_topic
from cnode.storage import BlockStore, compute_cid

RUN = "topics-run"
UPDATE = compute_cid(b"an update manifest")
BASE = compute_cid(b"the parent state")


async def _eventually(predicate: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    with trio.fail_after(limit_s):
        while not predicate():
            await trio.sleep(0.05)


def test_a_gossiped_header_makes_its_signer_a_holder_of_the_update(tmp_path: Path) -> None:
    a_id, b_id = Identity.generate(), Identity.generate()
    members = {a_id.peer_id_str, b_id.peer_id_str}
    coordinator = Identity.generate().peer_id_str
    header = UpdateHeader(RUN, 1, a_id.peer_id_str, 8, UPDATE, BASE)
    envelope = seal_update_header(a_id, header)
    sent: list[str] = []
    published: list[str] = []

    async def main() -> None:
        settings = P2PSettings(run_id=RUN)
        async with (
            open_p2p_node(
                a_id, BlockStore(tmp_path / "a"), settings, allow=members.__contains__
            ) as a,
            open_p2p_node(
                b_id, BlockStore(tmp_path / "b"), settings, allow=members.__contains__
            ) as b,
            trio.open_nursery() as nursery,
        ):
            a_topics = RunTopics(RUN, coordinator, HeaderCollector(RUN, members.__contains__))
            b_headers = HeaderCollector(RUN, members.__contains__)
            b_topics = RunTopics(RUN, coordinator, b_headers)
            nursery.start_soon(a_topics.run_all, a, lambda _state: None)
            nursery.start_soon(b_topics.run_all, b, lambda _state: None)
            await b.connect(a.listen_addrs[0])
            await trio.sleep(1.5)  # subscriptions exchanged, mesh formed
            real_publish = a.publish  # observed, not replaced: every call still publishes

            async def counting_publish(topic: str, data: bytes) -> None:
                sent.append(topic)
                await real_publish(topic, data)

            a.publish = counting_publish  # type: ignore[method-assign]
            await a_topics.publish_header(a, envelope)
            await _eventually(lambda: (1, a.peer_id) in b_headers.seen, "the header at B")
            assert b.holders(UPDATE) == {a.peer_id}
            await trio.sleep(2.5)  # the old code repeated the header 1 and 2 s after
            published.extend(sent)  # (a node that closes says `departure`: not counted)
            nursery.cancel_scope.cancel()

    with structlog.testing.capture_logs():
        trio.run(main)
    # The header, once (the old code repeated it 1, 2, 4, 8 and 16 s after). That a round sends
    # no `update` announcement beside it is the round loop's doing (_train_and_publish); this
    # test shows only that the header alone makes its signer a holder.
    assert published == [updates_topic(RUN)]
