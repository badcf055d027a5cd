"""The coordinator's rules without a database or a server (issue 40): facts written by hand as
typed rows, decisions read as typed writes, the way httpx's core is tested without sockets.

``sqlite3.connect`` raises in every test here, so a rule that reached for the database would
fail; no server is started. The same rules run over the real store in the other tests of this
folder (test_rounds.py, test_partitions.py, test_bans.py, ...)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from cnode.aggregation import EvidenceKind, assign_partitions, backup_aggregators
from cnode.node.coordinator import RoundsConfig, RunConfig
from cnode.node.coordinator._bans._evidence import judge_partition_verdict
from cnode.node.coordinator._bans._reputation import replay_bound, replay_round
from cnode.node.coordinator._bans._verdicts import PartitionVerdict, ReputationVerdict
from cnode.node.coordinator._exceptions import RequestRefused
from cnode.node.coordinator._rounds._machine import RunMachine
from cnode.node.coordinator._store._facts import RoundFacts, RunFacts
from cnode.node.coordinator._store._rows import (
    MemberRow,
    MemberStatus,
    ResultRow,
    RoundRow,
    RunRow,
)
from cnode.node.coordinator._store._writes import (
    Log,
    OpenRound,
    PutBan,
    PutMember,
    PutResult,
    ReplaceResult,
    SetMember,
    SetRound,
    SetRun,
    Write,
)
from cnode.node.coordinator._wire._ban_records import BanKind
from cnode.node.coordinator._wire._protocol import Phase, RoundStatus

RUN = "rules-run"
PEERS = [f"peer-{c}" for c in "abcde"]
T0 = 1_000.0


@pytest.fixture(autouse=True)
def _no_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*_args: Any, **_kw: Any) -> None:
        raise AssertionError("a rule opened a database")

    monkeypatch.setattr(sqlite3, "connect", refuse)
    yield


def _machine(partitioned: str = "never", scores: bool = False, **rounds: Any) -> RunMachine:
    defaults: dict[str, Any] = {"min_participants": 2, "round_timeout_s": 30.0}
    config = RunConfig(
        run=RUN,
        rounds=RoundsConfig(**(defaults | rounds)),
        training={"partitioned": partitioned, "scores": scores},
    )
    return RunMachine(config, "coordinator-peer")


def _round(n: int, status: RoundStatus = RoundStatus.OPEN, **fields: Any) -> RoundRow:
    row: dict[str, Any] = {
        "round": n, "epoch": 0, "status": status, "opened_at": T0, "closed_at": None,
        "deadline": None, "published_at": None, "members": [], "collect_deadline": None,
        "agreed_at": None, "agreed": None, "excluded": {}, "parts": 0, "backup_steps": 0,
        "verify_deadline": None, "results_open": None, "backup_step": None,
    }  # fmt: skip
    return RoundRow(**(row | fields))


def _member(
    n: int, peer: str, status: MemberStatus = MemberStatus.JOINED, **fields: Any
) -> MemberRow:
    row: dict[str, Any] = {
        "round": n, "peer": peer, "username": "", "status": status, "joined_at": T0,
        "ready_at": None, "header": None, "missing": None, "collected_at": None,
        "checked": None, "checked_at": None, "score_record": None, "scored_at": None,
    }  # fmt: skip
    return MemberRow(**(row | fields))


def _facts(run: RunRow, *rounds: RoundFacts, latest: Any = None) -> RunFacts:
    by_round = {f.row.round: f for f in rounds if f.row is not None}
    by_round.setdefault(run.round, RoundFacts(_round(run.round)))
    by_round.setdefault(run.round + 1, RoundFacts(None))
    return RunFacts(run, by_round, latest)


def _next(n: int = 2) -> RoundFacts:
    """Round ``n`` open, with two members joined: a run that waits on nothing else."""
    return RoundFacts(_round(n), {p: _member(n, p) for p in PEERS[:2]})


def _training(n: int = 1) -> RunRow:
    return RunRow(Phase.TRAINING, None, 0, n, None)


def _kinds(writes: list[Write]) -> list[str]:
    return [w.kind for w in writes if isinstance(w, Log)]


def _apply_round(f: RoundFacts, writes: list[Write]) -> RoundFacts:
    """The round's facts after ``writes`` (what the store would read back): enough of the
    store's semantics for these tests to follow a round through several steps."""
    row, members, results = f.row, dict(f.members), dict(f.results)
    for w in writes:
        match w:
            case SetRound(n, values) if row is not None and n == row.round:
                row = RoundRow(**(vars(row) | dict(values)))
            case SetMember(n, peer, values) if row is not None and n == row.round:
                kept = {k: v for k, v in values.items() if k != "score_bytes"}
                members[peer] = MemberRow(**(vars(members[peer]) | kept))
            case PutResult(n, partition, peer, header, at):
                results[partition] = ResultRow(n, partition, peer, header, None, None, at)
    return RoundFacts(row, members, results, f.banned)


# -- a full round, step by step --------------------------------------------------------------------


def test_a_round_closes_at_its_first_ready_member_and_publishes_when_all_are() -> None:
    m = _machine()
    a, b = PEERS[:2]
    one = RoundFacts(
        _round(1), {a: _member(1, a, MemberStatus.READY, header="h-a"), b: _member(1, b)}
    )
    step = m.step(_facts(_training(), one), T0 + 1)
    assert not step.settled and _kinds(step.writes) == ["round_closed"]
    assert step.writes[0] == SetRound(
        1, {"status": RoundStatus.CLOSED, "closed_at": T0 + 1, "deadline": T0 + 31}
    )
    closed = _apply_round(one, step.writes)
    # Still one member not ready: settled, and the state says why.
    waiting = m.step(_facts(_training(), closed), T0 + 2)
    assert waiting.settled and waiting.writes == [
        SetRun({"waiting": "round 1: 1 of 2 members not ready yet"})
    ]
    ready = _apply_round(closed, m.ready(_facts(_training(), closed), b, 1, T0 + 3, "h-b"))
    publish = m.step(_facts(_training(), ready), T0 + 3)
    assert OpenRound(2, 0, T0 + 3) in publish.writes and SetRun({"round": 2}) in publish.writes
    published = next(w for w in publish.writes if isinstance(w, SetRound))
    assert published.values["members"] == [a, b] and published.values["parts"] == 0


def test_a_closed_round_drops_the_unready_at_its_deadline() -> None:
    m = _machine()
    a, b, c = PEERS[:3]
    closed = RoundFacts(
        _round(1, RoundStatus.CLOSED, deadline=T0 + 30),
        {
            a: _member(1, a, MemberStatus.READY, header="h"),
            b: _member(1, b, MemberStatus.READY, header="h"),
            c: _member(1, c),
        },
    )
    assert m.step(_facts(_training(), closed), T0 + 29).settled
    step = m.step(_facts(_training(), closed), T0 + 30)
    assert step.writes[:1] == [SetMember(1, c, {"status": MemberStatus.DROPPED})]
    assert _kinds(step.writes) == ["members_dropped"]


def test_phases_wait_for_members_then_warm_up() -> None:
    m = _machine(warmup_s=5.0)
    waiting = RunRow(Phase.WAITING_FOR_MEMBERS, None, 0, 1, None)
    one = RoundFacts(_round(1), {PEERS[0]: _member(1, PEERS[0])})
    step = m.step(_facts(waiting, one), T0)
    assert step.settled and step.writes == [SetRun({"waiting": "round 1 has 1 of 2 participants"})]
    two = RoundFacts(_round(1), {p: _member(1, p) for p in PEERS[:2]})
    step = m.step(_facts(waiting, two), T0)
    assert step.writes[0] == SetRun({"phase": Phase.WARMUP, "phase_until": T0 + 5.0})


# -- the full round's input set (specs/coordinator.md#agreement) -----------------------------------


def _published(reports: dict[str, list[str]], banned: frozenset[str] = frozenset()) -> RoundFacts:
    members = PEERS[:5]
    rows = {
        p: _member(
            1,
            p,
            MemberStatus.READY,
            header=f"h-{p}",
            missing=reports.get(p),
            collected_at=T0 + 1 if p in reports else None,
        )
        for p in members
    }
    row = _round(
        1, RoundStatus.PUBLISHED, published_at=T0, collect_deadline=T0 + 90, members=members
    )
    return RoundFacts(row, rows, {}, banned)


def test_an_update_is_in_when_a_strict_majority_holds_it() -> None:
    m = _machine()
    a, b, c, d, e = PEERS
    # Everyone reported: c lacks d's update, d and e lack a's: a held by 3 of 5, d by 4.
    reports = {a: [], b: [], c: [d], d: [a], e: [a]}
    f = _published(reports, banned=frozenset({e}))
    step = m.step(_facts(_training(2), f, _next()), T0 + 2)
    agreed = next(w for w in step.writes if isinstance(w, SetRound))
    assert agreed.values["agreed"] == [a, b, c, d]
    assert agreed.values["excluded"] == {e: "banned"}


def test_a_minority_cannot_force_an_update_in_and_the_silent_count_as_lacking() -> None:
    m = _machine()
    a, b = PEERS[:2]
    f = _published({a: [], b: []})  # two of five reported; the rest stay silent
    assert m.step(_facts(_training(2), f, _next()), T0 + 2).writes == []  # settled, waiting
    late = m.step(
        _facts(_training(2), f, _next()), T0 + 90 + 61
    )  # past the pace rule's latest close
    agreed = next(w for w in late.writes if isinstance(w, SetRound))
    assert agreed.values["agreed"] == []
    assert agreed.values["excluded"][a] == "update held by 2 of the round's 5 members (2 reported)"


# -- membership ops --------------------------------------------------------------------------------


def test_join_round_is_idempotent_and_lands_in_the_next_round_once_the_list_closed() -> None:
    m = _machine()
    a, b = PEERS[:2]
    closed = RoundFacts(_round(1, RoundStatus.CLOSED, deadline=T0 + 30), {a: _member(1, a)})
    f = _facts(_training(), closed)
    assert m.join_round(f, a, "", T0) == (1, [])
    n, writes = m.join_round(f, b, "", T0)
    assert n == 2 and writes[0] == PutMember(2, b, "", T0)


def test_ops_refuse_with_registered_codes() -> None:
    m = _machine()
    f = _facts(_training(), RoundFacts(_round(1)))
    with pytest.raises(RequestRefused) as caught:
        m.ready(f, PEERS[0], 1, T0)
    assert caught.value.code == "not_member"
    with pytest.raises(RequestRefused) as caught:
        m.consume_counter(PEERS[0], 5, last=5)
    assert caught.value.code == "replayed"
    with pytest.raises(RequestRefused) as caught:
        m.check_may_join(PEERS[0], "", None, listed=[])
    assert caught.value.code == "not_allowlisted"


# -- partitioned rounds ----------------------------------------------------------------------------


def _partitioned(results: dict[int, ResultRow] | None = None, **fields: Any) -> RoundFacts:
    members = sorted(PEERS[:3])
    status = fields.pop("status", RoundStatus.PUBLISHED)
    row = _round(
        1,
        status,
        published_at=T0,
        collect_deadline=T0 + 90,
        members=members,
        parts=3,
        **fields,
    )
    rows = {p: _member(1, p, MemberStatus.READY, header=f"h-{p}") for p in members}
    return RoundFacts(row, rows, results or {})


def test_a_backup_may_submit_only_from_its_step_of_the_result_window() -> None:
    m = _machine(partitioned="auto", backup_step_s=10.0)
    members = sorted(PEERS[:3])
    agg = assign_partitions(RUN, 1, members, 3)
    first = backup_aggregators(RUN, 1, members, 0)[0]
    f = _partitioned()
    with pytest.raises(RequestRefused) as caught:
        m.partitions.result(f, first, 1, 0, "h0", T0 + 1)
    assert caught.value.code == "not_your_partition"
    # At the collect deadline the window opens (no scores in this run), with its step.
    opened = m.partitions.step(f, T0 + 90)
    assert opened[0] == SetRound(1, {"results_open": T0 + 90, "backup_step": 10.0})
    f = _apply_round(f, opened)
    with pytest.raises(RequestRefused):
        m.partitions.result(f, first, 1, 0, "h0", T0 + 99)
    writes = m.partitions.result(f, first, 1, 0, "h0", T0 + 100)
    assert writes[0] == PutResult(1, 0, first, "h0", T0 + 100)
    excluded = next(w for w in writes if isinstance(w, SetRound)).values["excluded"]
    assert excluded == {
        agg[0]: f"partition 0: no result by the deadline; aggregated by backup {first}"
    }


def test_a_partitioned_round_is_agreed_once_every_member_checked() -> None:
    m = _machine(partitioned="auto")
    members = sorted(PEERS[:3])
    results = {p: ResultRow(1, p, members[p], f"r{p}", None, None, T0) for p in range(3)}
    f = _partitioned(results, results_open=T0 + 90, backup_step=15.0)
    verify = m.partitions.step(f, T0 + 95)
    assert _kinds(verify) == ["results_complete"]
    f = _apply_round(f, verify)
    for p in members:
        f = _apply_round(f, m.partitions.checked(f, p, 1, [], T0 + 96))
    agreed = m.partitions.step(f, T0 + 96)
    assert _kinds(agreed) == ["round_agreed"]
    assert agreed[0].values["agreed"] == members  # type: ignore[union-attr]


def test_a_recomputation_that_confirms_the_result_is_refused() -> None:
    recorded = ResultRow(1, 0, "aggregator", "header", None, None, T0)
    right = PartitionVerdict("aggregator", 0, "out", "out", correct=True)
    with pytest.raises(RequestRefused) as caught:
        judge_partition_verdict(right, recorded, 1, 0)
    assert caught.value.code == "result_correct"
    other = PartitionVerdict("someone-else", 0, "out", "other", correct=False)
    with pytest.raises(RequestRefused) as caught:
        judge_partition_verdict(other, recorded, 1, 0)
    assert caught.value.code == "bad_evidence"


# -- bans ------------------------------------------------------------------------------------------


def _evidence(accused: str, kind: EvidenceKind = EvidenceKind.REJECTED) -> dict[str, Any]:
    return {
        "round": 1,
        "peer": accused,
        "kind": kind,
        "reason": "bad update",
        "update_cid": "u",
        "figures": "",
    }


def test_a_strict_majority_of_the_other_members_bans() -> None:
    m = _machine()
    a, b, c, _d, e = PEERS
    f = _facts(_training(2), _published({}), _next())
    # Five members: a strict majority of the four others is 3 reports.
    report, writes = m.bans.report(f, a, _evidence(e), T0, earlier=[], username="")
    assert (report.reports, report.needed, report.banned) == (1, 3, False)
    assert not any(isinstance(w, PutBan) for w in writes)
    report, _ = m.bans.report(f, a, _evidence(e), T0, earlier=[a], username="")  # a resend
    assert (report.reports, report.banned) == (1, False)
    report, writes = m.bans.report(f, b, _evidence(e), T0, earlier=[a, c], username="user-e")
    assert report.banned and report.reports == 3
    ban = next(w for w in writes if isinstance(w, PutBan)).row
    assert (ban.peer, ban.username, ban.kind) == (e, "user-e", BanKind.MAJORITY)
    assert ban.evidence["reporters"] == [a, b, c]


def test_a_reputation_report_the_records_refute_is_refused() -> None:
    m = _machine()
    a, e = PEERS[0], PEERS[4]
    f = _facts(_training(2), _published({}), _next())
    refuted = ReputationVerdict(decided=True, correct=False, reason="other figures")
    with pytest.raises(RequestRefused) as caught:
        m.bans.report(f, a, _evidence(e, EvidenceKind.REPUTATION), T0, earlier=[], username="",
                      verdict=refuted)  # fmt: skip
    assert caught.value.code == "evidence_refuted"


def test_a_wrong_result_bans_its_signer_and_replaces_the_output() -> None:
    m = _machine(partitioned="auto")
    members = sorted(PEERS[:3])
    signer = members[1]
    results = {0: ResultRow(1, 0, signer, "h0", None, None, T0)}
    f = _facts(_training(2), _partitioned(results), _next())
    writes = m.partitions.wrong_result(
        f, members[0], 1, 0, signer=signer, signer_username="", claimed="c", recomputed="r",
        reported="r", now=T0,
    )  # fmt: skip
    assert writes[0] == ReplaceResult(1, 0, "r", members[0])
    ban = next(w for w in writes if isinstance(w, PutBan)).row
    assert (ban.peer, ban.kind, ban.by) == (signer, BanKind.PARTITION, members[0])


def test_what_a_reputation_replay_reads() -> None:
    agreed = _partitioned(status=RoundStatus.AGREED)
    records = {p: b"record" for p in PEERS}  # one of a peer that was no member: left out
    got = replay_round(agreed, 1, records, opened=0)
    assert not isinstance(got, str)
    (r, headers, kept), opened = got
    assert (r, opened) == (1, 3) and sorted(kept) == sorted(PEERS[:3])
    assert headers == {p: f"h-{p}" for p in sorted(PEERS[:3])}
    assert replay_round(_partitioned(), 1, records, 0) == "round 1 is not agreed"
    assert replay_bound(10**6) is not None and replay_bound(1) is None
