"""Reputation-ban evidence checked by the coordinator itself, against a real coordinator over
HTTP (specs/coordinator.md#bans): four members play three partitioned rounds with real signed
score records; one of them harms its data every round. The coordinator replays the records it
closed each round with (the training package's checker, as ``cnode coordinator serve`` wires it)
and bans on the first true report; forged reports are refused naming what is wrong and ban
nobody; a round whose scorers disagree leaves the report to the majority rule."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from cnode.aggregation import BanRecommendation, ReputationPolicy, score_seed
from cnode.auth import Identity, seal
from cnode.node.cli._coordinator import check_reputation
from cnode.node.coordinator import BanKind, CoordinatorClient, CoordinatorRejected, limits
from cnode.node.train import ScoreRecord, open_score_record, seal_score_record
from cnode.node.train.scores import SCORE_RECORD_TYPE, BadScoreRecordError, SpreadRecords
from cnode.node.train.scores._records import TargetLosses
from cnode.node.train.scores._spread import bad_record, resolve_scores, targets_of
from cnode.storage import CID, compute_cid

from .conftest import Running, run_config

RUN = "test-run"
BASE = compute_cid(b"the parent state", 0x71)
# From reputation 0, an EMA of standings at the clamp is below BAN_REPUTATION from round 7: the
# third such round in a row is round 9.
ROUNDS = 9


def _header(peer: str, n: int) -> CID:
    return compute_cid(f"update of {peer} in round {n}".encode(), 0x71)


def _losses(target: str, attacker: str, n: int, *, lie: bool = False) -> TargetLosses:
    if target == attacker:  # its update harms its own data (-2500 units) and the held-out split
        return TargetLosses(_header(target, n), 2.0, 1.5 if lie else 2.5, 2.0, 2.5)
    # Honest own-data scores of 200, 500 and 800 units by the target's id: an honest spread of
    # 600 units in which the attacker sits 4.5 spreads below the median (the reputation path,
    # not the blatant one at 10 spreads).
    k = sum(target.encode()) % 3
    return TargetLosses(_header(target, n), 2.0, 1.96 - 0.06 * k, 2.0, 1.99)


async def _play_round(
    clients: dict[str, CoordinatorClient],
    ids: dict[str, Identity],
    n: int,
    attacker: str,
    liar: str | None = None,
    extreme: str | None = None,
) -> dict[str, bytes]:
    """Round ``n``: join, ready, every member signs its score record, results, checked ->
    agreed. ``liar`` (a scorer of the attacker) signs a flattering score; ``extreme`` signs a
    record with issue 29's out-of-range loss. Return the records."""
    for c in clients.values():
        assert await c.join_round() == n
    for peer, c in clients.items():
        await c.ready(n, header=str(_header(peer, n)))
    first = next(iter(clients.values()))
    with trio.fail_after(10):
        info = await first.wait_members(n)
    members = sorted(clients)
    seed = score_seed(str(_header(m, n)) for m in members)
    records: dict[str, bytes] = {}
    for peer, c in clients.items():
        targets = targets_of(RUN, n, members, peer)
        scores = {t: _losses(t, attacker, n, lie=peer == liar) for t in targets}
        record = ScoreRecord(RUN, n, peer, BASE, seed, scores, {})
        records[peer] = seal_score_record(ids[peer], record)
        if peer == extreme:
            payload = record.to_payload()
            for losses in payload["scores"].values():
                losses[1:] = [5.0, -1e308, 5.0, 4.9]
            records[peer] = seal(ids[peer], SCORE_RECORD_TYPE, payload)
        await c.score(n, record=records[peer])
    for p, peer in enumerate(info.aggregators):
        await clients[peer].result(n, partition=p, header=str(_header(f"result {p}", n)))
    for c in clients.values():
        await c.checked(n, wrong=[])
    with trio.fail_after(10):
        await first.wait_agreed(n)
    return records


def _evidence(all_records: list[dict[str, bytes]], attacker: str) -> BanRecommendation:
    """What every honest node reports: the agreed scores of each round into ReputationPolicy."""
    policy, reputation, found = ReputationPolicy(), dict[str, int](), []
    for n, data in enumerate(all_records, start=1):
        members = sorted(data)
        headers = {m: _header(m, n) for m in members}
        records = {
            p: (compute_cid(b, 0x71), open_score_record(b, run=RUN, round_=n, signer=p))
            for p, b in data.items()
        }
        resolved = resolve_scores(
            SpreadRecords(RUN, n, members, headers, BASE,
                        score_seed(str(c) for c in headers.values()), records),
            reputation=reputation, recompute=lambda t, n=n: _losses(t, attacker, n),
        )  # fmt: skip
        reputation = resolved.reputation
        cids = {p: str(h) for p, h in headers.items()}
        found += policy.observe(n, resolved.seed, resolved.scores, reputation, cids)
    assert [b.peer for b in found] == [attacker]
    return found[0]


@pytest.fixture
def peers() -> list[Identity]:
    """Fixed identities whose three honest ids give own-data scores of 200, 500 and 800 units
    (``_losses`` picks by id): random ones sometimes gave two honest peers the same score, a
    smaller spread, and the blatant path's ban in round 3 instead of the reputation path's."""
    return [Identity.from_seed(bytes([3 + i]) * 32) for i in range(4)]


def _setup(serve: Any, peers: list[Identity]) -> Running:
    return serve(
        run_config(peers, partitioned="always", min_participants=4),
        reputation_checker=check_reputation,
    )


def _clients(running: Running, peers: list[Identity]) -> dict[str, CoordinatorClient]:
    return {
        p.peer_id_str: CoordinatorClient(
            running.url, run=RUN, coordinator=running.peer_id, identity=p
        )
        for p in peers
    }


async def _refused(
    client: CoordinatorClient, payload: dict[str, Any], code: str, words: str
) -> None:
    with pytest.raises(CoordinatorRejected) as caught:
        await client.report_ban_evidence(payload)
    assert caught.value.code == code, caught.value
    assert words in caught.value.message, caught.value


def _forged(payload: dict[str, Any], **figures: Any) -> dict[str, Any]:
    return {**payload, "figures": {**payload["figures"], **figures}}


def test_true_evidence_bans_on_one_report_and_forged_evidence_is_refused(
    serve: Any, peers: list[Identity]
) -> None:
    running = _setup(serve, peers)
    ids = {p.peer_id_str: p for p in peers}
    attacker, *honest = sorted(ids)

    async def main() -> None:
        clients = _clients(running, peers)
        for c in clients.values():
            await c.join()
        played = [await _play_round(clients, ids, n, attacker) for n in range(1, ROUNDS + 1)]
        true = _evidence(played, attacker).to_payload()
        assert true["round"] == ROUNDS and true["figures"]["rounds"] == [7, 8, 9]
        reporter = clients[honest[0]]
        figures = true["figures"]
        forged_reps = [r - 1 for r in figures["reputations"]]
        await _refused(reporter, _forged(true, reputations=forged_reps), "evidence_refuted",
                       "reputations")  # fmt: skip
        await _refused(reporter, _forged(true, bounds=[0, 0, 0]), "evidence_refuted", "bounds")
        await _refused(reporter, _forged(true, rounds=[8, 9]), "evidence_refuted", "rounds")
        scores = [{**s, "own_after": 3.5} for s in figures["scores"]]
        await _refused(reporter, _forged(true, scores=scores), "evidence_refuted", "scores")
        seeds = ["00" * 32] * 3
        await _refused(reporter, _forged(true, seeds=seeds), "evidence_refuted", "seeds")
        await _refused(reporter, {**true, "figures": "not json"}, "evidence_refuted", "not JSON")
        # An honest member accused with the attacker's figures: the records keep it above.
        await _refused(
            reporter, {**true, "peer": honest[1]}, "evidence_refuted", "at or above the ban bound"
        )
        await _refused(reporter, {**true, "round": 8}, "evidence_refuted", "rounds")
        stranger = Identity.generate().peer_id_str
        await _refused(reporter, {**true, "peer": stranger}, "bad_accused", "not another member")
        big = {**true, "figures": "x" * (limits.MAX_FIGURES_CHARS + 1)}
        await _refused(reporter, big, "bad_request", "MAX_FIGURES_CHARS")
        assert await reporter.bans() == []
        db = running.server.store.db
        assert db.execute("SELECT COUNT(*) FROM ban_reports").fetchone()[0] == 0  # none kept
        answer = await reporter.report_ban_evidence(true)
        assert answer.banned and answer.reports == 1 and answer.needed == 2
        bans = await reporter.bans()
        assert [(b.peer, b.kind, b.by, b.round) for b in bans] == [
            (attacker, BanKind.CHECKED, honest[0], ROUNDS)
        ]
        kept = running.server.store.ban_row(attacker)
        assert kept is not None and kept.evidence["reporters"] == [honest[0]]
        for n, records in enumerate(played, start=1):  # nothing stored is lost
            assert await reporter.score_records(n) == records
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_a_disputed_round_leaves_the_report_to_the_majority(
    serve: Any, peers: list[Identity]
) -> None:
    running = _setup(serve, peers)
    ids = {p.peer_id_str: p for p in peers}
    attacker, *honest = sorted(ids)

    async def main() -> None:
        clients = _clients(running, peers)
        for c in clients.values():
            await c.join()
        played = []
        for n in range(1, ROUNDS + 1):
            members = sorted(ids)
            scorers = [s for s in members if attacker in targets_of(RUN, n, members, s)]
            liar = scorers[0] if n == 2 else None  # one scorer flatters the attacker in round 2
            played.append(await _play_round(clients, ids, n, attacker, liar))
        true = _evidence(played, attacker).to_payload()
        first = await clients[honest[0]].report_ban_evidence(true)
        assert not first.banned and (first.reports, first.needed) == (1, 2)
        second = await clients[honest[1]].report_ban_evidence(true)
        assert second.banned and second.reports == 2
        bans = await clients[honest[0]].bans()
        assert [(b.kind, b.by) for b in bans] == [(BanKind.MAJORITY, honest[1])]
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_a_round_without_score_records_leaves_the_report_to_the_majority(
    serve: Any, peers: list[Identity]
) -> None:
    # A full-replication round: its scores are computed by each node and never reach the
    # coordinator, so the records cannot decide (whatever the figures say).
    running = serve(run_config(peers, min_participants=4), reputation_checker=check_reputation)
    accused = peers[3].peer_id_str
    report = {
        "peer": accused,
        "round": 1,
        "kind": "reputation",
        "reason": "reputation below the ban bound in 3 rounds in a row",
        "update_cid": str(_header(accused, 1)),
        "figures": {"rounds": [1], "reputations": [-1875]},
    }

    async def main() -> None:
        clients = _clients(running, peers)
        for c in clients.values():
            await c.join()
            assert await c.join_round() == 1
        for c in clients.values():
            await c.ready(1)
        first, second = (clients[p.peer_id_str] for p in peers[:2])
        with trio.fail_after(10):
            await first.wait_members(1)
        answer = await first.report_ban_evidence(report)
        assert (answer.reports, answer.needed, answer.banned) == (1, 2, False)
        answer = await second.report_ban_evidence(report)
        bans = await first.bans()
        assert answer.banned and [(b.kind, b.by) for b in bans] == [
            (BanKind.MAJORITY, peers[1].peer_id_str)
        ]
        for c in clients.values():
            await c.aclose()

    trio.run(main)


def test_an_out_of_range_record_is_evidence_the_coordinator_checks_itself(
    serve: Any, peers: list[Identity]
) -> None:
    """Issue 29: a member signs a record with a finite but extreme loss. The coordinator stores
    it (it checks signatures, not losses); a report naming it bans its signer at once (the
    coordinator opens the record itself); a report naming an honest member's record is refused;
    a reputation replay over that round decides (the bad record is skipped), not a 500."""
    running = _setup(serve, peers)
    ids = {p.peer_id_str: p for p in peers}
    attacker, *honest = sorted(ids)
    bad, reporter_id = honest[-1], honest[0]

    async def main() -> None:
        clients = _clients(running, peers)
        for c in clients.values():
            await c.join()
        played = [await _play_round(clients, ids, 1, attacker, extreme=bad)]
        with pytest.raises(BadScoreRecordError, match="value 2 is not a loss"):
            open_score_record(played[0][bad], run=RUN, round_=1, signer=bad)
        cid = compute_cid(played[0][bad], 0x71)
        true = bad_record(1, bad, cid, "losses: value 2 is not a loss").to_payload()
        reporter = clients[reporter_id]
        # An honest member's valid record named as bad: refused, nobody banned.
        good = compute_cid(played[0][honest[1]], 0x71)
        forged = bad_record(1, honest[1], good, "losses: value 2 is not a loss").to_payload()
        await _refused(reporter, forged, "evidence_refuted", "decodes: it is a valid record")
        await _refused(
            reporter, {**true, "figures": {"score_record": str(good)}}, "evidence_refuted",
            "not the one named",
        )  # fmt: skip
        # A reputation report over that round is replayed (the bad record skipped), no 500.
        await _refused(reporter, {**true, "kind": "reputation", "reason": "reputation below the "
                       "ban bound in 3 rounds in a row", "figures": {"rounds": [1]}},
                       "evidence_refuted", "rounds")  # fmt: skip
        answer = await reporter.report_ban_evidence(true)
        assert answer.banned and answer.reports == 1
        bans = await reporter.bans()
        assert [(b.peer, b.kind, b.by, b.round) for b in bans] == [
            (bad, BanKind.CHECKED, reporter_id, 1)
        ]
        for c in clients.values():
            await c.aclose()

    trio.run(main)
