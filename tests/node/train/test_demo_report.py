"""The demo's report puts a ban's evidence in words, for either kind of ban."""

from __future__ import annotations

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
