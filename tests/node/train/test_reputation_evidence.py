"""The replay behind the coordinator's own check of a reputation report, without the network:
what the records decide, and when they leave the report to the majority (a record on another
seed, records on different parent states). The HTTP path and the refusals are in
tests/node/coordinator/test_reputation_evidence.py."""

from __future__ import annotations

from cnode.aggregation import score_seed
from cnode.auth import Identity
from cnode.node.train import ScoreRecord, check_reputation_evidence, seal_score_record
from cnode.node.train.scores._records import TargetLosses
from cnode.node.train.scores._spread import targets_of
from cnode.storage import CID, compute_cid

RUN = "test-run"


def _header(peer: str, n: int) -> CID:
    return compute_cid(f"update of {peer} in round {n}".encode(), 0x71)


def _rounds(
    ids: dict[str, Identity],
    attacker: str,
    *,
    seed_of: str | None = None,
    base_of: str | None = None,
) -> list[tuple[int, dict[str, str], dict[str, bytes]]]:
    """Three rounds; ``seed_of`` signs round 2 on another seed, ``base_of`` on another base."""
    out = []
    members = sorted(ids)
    for n in (1, 2, 3):
        headers = {m: str(_header(m, n)) for m in members}
        seed = score_seed(headers.values())
        records = {}
        for peer in members:
            scores = {
                t: TargetLosses(_header(t, n), 2.0, 3.0 if t == attacker else 1.9, 2.0, 2.0)
                for t in targets_of(RUN, n, members, peer)
            }
            odd = n == 2
            record = ScoreRecord(
                RUN, n, peer,
                compute_cid(b"other" if odd and peer == base_of else b"base", 0x71),
                bytes(32) if odd and peer == seed_of else seed,
                scores, {},
            )  # fmt: skip
            records[peer] = seal_score_record(ids[peer], record)
        out.append((n, headers, records))
    return out


def test_records_on_another_seed_or_base_leave_the_report_undecided() -> None:
    ids = {i.peer_id_str: i for i in (Identity.generate() for _ in range(4))}
    attacker, other = sorted(ids)[:2]
    plain = check_reputation_evidence(
        _rounds(ids, attacker), run=RUN, accused=attacker, round_=3, figures="{}"
    )
    assert plain.decided and not plain.correct and "rounds" in plain.reason
    seed = check_reputation_evidence(
        _rounds(ids, attacker, seed_of=other), run=RUN, accused=attacker, round_=3, figures="{}"
    )
    assert not seed.decided and "round 2" in seed.reason and "seed" in seed.reason
    base = check_reputation_evidence(
        _rounds(ids, attacker, base_of=other), run=RUN, accused=attacker, round_=3, figures="{}"
    )
    assert not base.decided and "round 2" in base.reason and "parent states" in base.reason
