"""The demo's report puts a ban's evidence in words, for either kind of ban."""

from __future__ import annotations

from pathlib import Path

from cnode.aggregation import EvidenceKind
from cnode.node.train.demo._report import _evidence_lines


def test_a_reputation_ban_shows_the_losses_scores_and_reputations() -> None:
    # The figures a node reports for a data attacker (scores are on by default).
    figures = {
        "rounds": [1, 2, 3],
        "reputations": [-5000, -8750, -11563],
        "bounds": [-25, -25, -25],
        "update_cids": ["bafy-1", "bafy-2", "bafy-3"],
        "seeds": ["aa", "bb", "cc"],
        "scores": [
            {
                "peer": "12D3KooW",
                "own_before": 6.93,
                "own_after": 29.15,
                "held_before": 6.92,
                "held_after": 28.66,
                "own": -10000,
                "held": -10000,
                "score": -20000,
            }
        ]
        * 3,
    }
    text = _evidence_lines(EvidenceKind.REPUTATION, "below the bound 3 rounds", figures)
    lines = text.splitlines()
    assert len(lines) == 4
    assert "loss on its own data 6.930 -> 29.150" in lines[1]
    assert "reputation -5000 (ban bound -25)" in lines[1]
    assert "update bafy-3" in lines[3]


def test_an_outlier_ban_shows_distances_and_weights() -> None:
    figures = {
        "rounds": [4],
        "distances": [3.25],
        "scores": [4.0],
        "clip_weights": [0.125],
        "update_cids": ["bafy-4"],
        "outlier_score": 1.5,
    }
    (head, line) = _evidence_lines(EvidenceKind.OUTLIER, "outlier", figures).splitlines()
    assert head == "  outlier evidence: outlier"
    assert "distance to the aggregate 3.2" in line
    assert "4.0x the median distance (outlier above 1.5)" in line
    assert "CenteredClip weight 0.125" in line


def test_the_ban_section_shows_the_kind_and_who_decided_by_name(tmp_path: Path) -> None:
    from rich.console import Console

    from cnode.node.coordinator import BanKind, BanRecord
    from cnode.node.train._report import Event
    from cnode.node.train.demo._report import _ban_section
    from cnode.node.train.demo._swarm import Role, _Proc

    procs = [
        _Proc("honest-1", Role.HONEST, tmp_path, "12D3KooWhonest1", 1, 11),
        _Proc("honest-2", Role.HONEST, tmp_path, "12D3KooWhonest2", 2, 12),
        _Proc("attacker", Role.ATTACKER, tmp_path, "12D3KooWattacker", 3, 13),
    ]
    report = {
        "event": Event.BAN_REPORTED,
        "accused": "12D3KooWattacker",
        "kind": "outlier",
        "reason": "outlier in 3 of the last 5 rounds",
        "figures": {"rounds": [4], "distances": [3.25], "update_cids": ["bafy-4"]},
    }
    events = {"honest-1": [], "honest-2": [report], "attacker": []}
    ban = BanRecord(
        "12D3KooWattacker", "", BanKind.CHECKED, "reputation low", 4, "12D3KooWhonest2", 0
    )
    console = Console(record=True, width=200)
    assert _ban_section(procs, events, [ban], console) == []
    text = console.export_text()
    assert "ban (checked): attacker attacker banned for round 4, checked by the coordinator" in text
    assert "(report of honest-2): reputation low" in text
    assert "outlier evidence: outlier in 3 of the last 5 rounds" in text
    # No ban in the signed state, or an honest one: each is a problem the report names.
    honest_ban = BanRecord("12D3KooWhonest1", "", BanKind.ADMIN, "x", None, "admin", 0)
    assert _ban_section(procs, events, [honest_ban], Console(file=None, quiet=True)) == [
        "the attacker was not banned by the coordinator",
        "an honest peer was banned",
    ]
