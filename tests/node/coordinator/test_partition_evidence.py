"""Evidence against a wrong partition result, against a real coordinator over HTTP: real nodes
train round 1, aggregate their partitions into a real block store, and one of them lies; the
coordinator recomputes the partition from the evidence CAR itself and bans the liar at once.
Refusals first (they need no recomputation), then the real evidence (specs/coordinator.md,
"Evidence of a wrong result")."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from cnode.aggregation import assign_partitions
from cnode.auth import Identity
from cnode.node.cli._coordinator import check_evidence
from cnode.node.coordinator import (
    BanKind,
    CoordinatorClient,
    CoordinatorRejected,
    RoundInfo,
    limits,
)
from cnode.node.train import (
    NodeTrainer,
    TrainingConfig,
    build_partition_evidence,
    model_numel,
    open_update_header,
    partition_result_cid,
)
from cnode.storage import BlockStore, compute_cid, manifest_closure

from .conftest import Running, body, refused, run_config

RUN = "test-run"
TRAINING = {"local_steps": 1, "batch_size": 2, "aggregator": "mean", "partitioned": "auto"}
HEADER = str(compute_cid(b"a partition result header", 0x71))


def _client(running: Running, peer: Identity) -> CoordinatorClient:
    return CoordinatorClient(running.url, run=RUN, coordinator=running.peer_id, identity=peer)


def _evidence_url(running: Running, n: int = 1, partition: int = 0) -> str:
    return f"{running.url}/v1/runs/{RUN}/rounds/{n}/partitions/{partition}/evidence"


def _send(
    running: Running,
    peer: Identity,
    token: bytes,
    args: dict[str, Any],
    car: Any = b"",
    *,
    op: str = "wrong_result",
    partition: int = 0,
    envelope: str | None = None,
) -> httpx.Response:
    if envelope is None:
        envelope = body(peer, op, args, token=token)["envelope"]
    return httpx.post(
        _evidence_url(running, 1, partition),
        content=car,
        headers={"X-Cnode-Request": envelope},
        timeout=60,
    )


def _publish(running: Running, members: list[Identity]) -> RoundInfo:
    async def main() -> RoundInfo:
        clients = [_client(running, p) for p in members]
        for c in clients:
            await c.join()
            await c.join_round()
        for c, p in zip(clients, members, strict=True):
            await c.ready(1, header=str(compute_cid(p.peer_id_str.encode(), 0x71)))
        with trio.fail_after(10):
            info = await clients[0].wait_members(1)
        for c in clients:
            await c.aclose()
        return info

    info: RoundInfo = trio.run(main)
    return info


def test_evidence_requests_are_checked_before_anything_is_read(serve: Any, peers: Any) -> None:
    running = serve(
        run_config(peers, partitioned="auto", min_participants=3), evidence_checker=check_evidence
    )
    info = _publish(running, peers[:3])
    by_id = {p.peer_id_str: p for p in peers}
    agg, verifier = by_id[info.aggregators[0]], by_id[info.aggregators[1]]
    with running.client(verifier) as c:
        token = c.join().token
    ok = {"round": 1, "partition": 0, "header": HEADER, "output": ""}
    # Nothing recorded for partition 0 yet: the header named is not the recorded result.
    refused(_send(running, verifier, token, ok), 409, "not_recorded", "no result")
    trio.run(_record, running, agg, HEADER)
    before = running.state()
    refused(_send(running, verifier, token, ok, op="result"), 400, "wrong_op", "'result'")
    response = httpx.post(_evidence_url(running), content=b"")
    refused(response, 400, "bad_request", "X-Cnode-Request")
    envelope = bytearray(
        base64.b64decode(body(verifier, "wrong_result", ok, token=token)["envelope"])
    )
    envelope[-5] ^= 0x01  # inside the signature
    refused(
        _send(running, verifier, token, ok, envelope=base64.b64encode(envelope).decode()),
        401,
        "bad_signature",
        "signature",
    )
    refused(
        _send(running, verifier, token, ok | {"partition": 1}),
        400,
        "bad_request",
        "the path round 1 partition 0",
    )
    refused(_send(running, verifier, token, ok | {"header": "x"}), 400, "bad_cid", "'header'")
    other = str(compute_cid(b"another header", 0x71))
    refused(_send(running, verifier, token, ok | {"header": other}), 409, "not_recorded", HEADER)
    refused(
        _send(running, verifier, token, ok | {"partition": 3}, partition=3),
        400,
        "bad_request",
        "not below parts",
    )
    # Malformed evidence: the real checker says what is wrong, and nothing is recorded or banned.
    refused(_send(running, verifier, token, ok, b"not a CAR file"), 400, "bad_evidence", "evidence")
    replayed = body(verifier, "wrong_result", ok, token=token, counter=1)["envelope"]
    refused(_send(running, verifier, token, ok, envelope=replayed), 409, "replayed", "counter 1")
    assert running.state() == before
    # A banned reporter is refused before its evidence is read.
    with running.admin() as admin:
        admin.ban(verifier.peer_id_str, "test")
    refused(_send(running, verifier, token, ok), 403, "banned", "test")


async def _record(running: Running, peer: Identity, header: str) -> None:
    async with _client(running, peer) as c:
        await c.join()
        await c.result(1, partition=0, header=header)


def _too_much() -> Iterator[bytes]:
    chunk = b"\x00" * (1 << 20)
    for _ in range(limits.MAX_EVIDENCE_BYTES // len(chunk)):
        yield chunk
    yield b"\x00"


def test_evidence_over_its_bound_is_refused_while_read(serve: Any, peers: Any) -> None:
    running = serve(
        run_config(peers, partitioned="auto", min_participants=3), evidence_checker=check_evidence
    )
    info = _publish(running, peers[:3])
    by_id = {p.peer_id_str: p for p in peers}
    trio.run(_record, running, by_id[info.aggregators[0]], HEADER)
    verifier = by_id[info.aggregators[1]]
    with running.client(verifier) as c:
        token = c.join().token
    before = running.state()
    args = {"round": 1, "partition": 0, "header": HEADER, "output": ""}
    response = _send(running, verifier, token, args, _too_much())  # chunked: no Content-Length
    refused(response, 413, "too_large", "MAX_EVIDENCE_BYTES")
    assert running.state() == before


# -- real evidence ---------------------------------------------------------------------------


def _nodes(tmp_path: Path, identities: list[Identity], liar: str) -> list[NodeTrainer]:
    config = TrainingConfig.from_dict(TRAINING)
    return [
        NodeTrainer(
            config,
            run=RUN,
            identity=ident,
            store=BlockStore(tmp_path / f"node{i}"),
            attack="wrong_partition" if ident.peer_id_str == liar else None,
        )
        for i, ident in enumerate(identities)
    ]


def _copy_all(src: BlockStore, dst: BlockStore) -> None:
    for cid in src.iter_cids():
        if not dst.has(cid):
            dst.put(cid, src.get(cid))


@pytest.mark.slow
def test_a_wrong_result_bans_its_signer_on_the_coordinators_recomputation(
    serve: Any, tmp_path: Path
) -> None:
    identities = [Identity.generate() for _ in range(3)]
    config = run_config(identities, partitioned="auto", min_participants=3)
    config = replace(config, training=TRAINING)
    running = serve(config, evidence_checker=check_evidence)
    members = sorted(i.peer_id_str for i in identities)
    aggregators = assign_partitions(RUN, 1, members, 3)
    liar = aggregators[0]
    nodes = _nodes(tmp_path, identities, liar)
    by_peer = {n.peer: n for n in nodes}
    own = {n.peer: n.train(1) for n in nodes}
    for a in nodes:
        for b in nodes:
            if a is not b:
                _copy_all(a.store, b.store)
    headers = {
        peer: (o.header_cid, open_update_header(o.envelope, run=RUN, round_=1, signer=peer))
        for peer, o in own.items()
    }
    for o in own.values():
        assert all(nodes[0].store.has(c) for c in manifest_closure(nodes[0].store, o.header.update))

    async def main() -> None:
        clients = {i.peer_id_str: _client(running, i) for i in identities}
        for c in clients.values():
            await c.join()
            assert await c.join_round() == 1
        for peer, c in clients.items():
            await c.ready(1, header=str(own[peer].header_cid))
        with trio.fail_after(10):
            info = await clients[liar].wait_members(1)
        assert info.aggregators == aggregators and info.parts == 3
        cids = {}
        for p, peer in enumerate(aggregators):
            envelope, _result = by_peer[peer].aggregate_partition(
                1, headers, partition=p, parts=3, missing={}
            )
            cids[p] = partition_result_cid(envelope)
            for node in nodes:
                node.store.put(cids[p], envelope)
            await clients[peer].result(1, partition=p, header=str(cids[p]))
        for a in nodes:
            for b in nodes:
                if a is not b:
                    _copy_all(a.store, b.store)
        numel = model_numel(TrainingConfig.from_dict(TRAINING))
        verifier = aggregators[1]
        store = by_peer[verifier].store
        # A correct result: refused, and the reporter is not banned for trying.
        car = build_partition_evidence(store, cids[2], numel=numel)
        with pytest.raises(CoordinatorRejected) as caught:
            await clients[verifier].partition_evidence(
                1, partition=2, header=str(cids[2]), output="", car=car
            )
        assert caught.value.code == "result_correct"
        assert (await clients[verifier].run_state()).banned(verifier) is None
        # Truncated evidence: 400 bad_evidence with the checker's message.
        car = build_partition_evidence(store, cids[0], numel=numel)
        with pytest.raises(CoordinatorRejected) as caught:
            await clients[verifier].partition_evidence(
                1, partition=0, header=str(cids[0]), output="", car=car[:-7]
            )
        assert caught.value.code == "bad_evidence"
        # The lie: banned at once, and the round record names the recomputed output.
        answer = await clients[verifier].partition_evidence(
            1, partition=0, header=str(cids[0]), output="", car=car
        )
        assert answer["banned"] is True and answer["replaced"] is True
        again = await clients[aggregators[2]].partition_evidence(
            1, partition=0, header=str(cids[0]), output="", car=car
        )
        assert again["recomputed"] == answer["recomputed"]  # a resend, or a second reporter
        record = await clients[verifier].round_info(1)
        entry = record.results["0"]
        assert entry.peer == liar and entry.header == str(cids[0])
        assert entry.replaced == answer["recomputed"] and entry.by == verifier
        ban = (await clients[verifier].run_state()).banned(liar)
        assert ban is not None and (ban.kind, ban.by) == (BanKind.PARTITION, verifier)
        # The words people read name the round, the partition and both outputs.
        assert "round 1 partition 0: header names " in ban.reason
        assert ban.reason.endswith(f"recomputation gives {answer['recomputed']}")
        # The round ends with the others' checks; the liar is excluded as banned.
        for peer in aggregators[1:]:
            await clients[peer].checked(1, wrong=[0] if peer == verifier else [])
        with trio.fail_after(10):
            agreed = await clients[verifier].wait_agreed(1)
        assert agreed.excluded == {liar: "banned"} and agreed.agreed == members
        for c in clients.values():
            await c.aclose()

    trio.run(main)
