"""bench/robustness.py measures the node's round decision, not a copy of it (issue 36).

The bench may import from ``cnode.aggregation`` only the round decision (``decide_round``,
``RoundEvidence``, ``admission`` for the adaptive attackers that aim at it), what a scorer
measures with (the node's score functions and batch draws), the attacks and the codecs. Any
piece of the decision imported on its own (``aggregate``, ``admit``, ``BanPolicy``, the quorum,
...) would let the bench decide by its own order of steps: that is what issue 36 found it doing.
A short real run then shows the bench's rounds are the decision's.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import cnode.aggregation as aggregation

BENCH = Path(__file__).resolve().parent.parent / "bench"
DECISION = {"decide_round", "RoundEvidence", "admission"}
MEASUREMENT = {"score_seed", "score_update", "draw_indices", "validate_update", "UpdateScore",
               "TensorSpec", "scored_config", "AggregatorConfig", "limits"}  # fmt: skip
ATTACKS = {"ATTACKS", "ATTACKS_DATA_LEVEL", "new_attack", "flip_labels"}
CODECS = {"decode_update_tensor", "encode_update_tensor", "wire_codec", "UpdateEncodingError"}
FILES = ("robustness.py", "_adaptive.py", "_digits.py", "_codec_pass.py")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cnode"):
            assert node.module in ("cnode.aggregation", "cnode.aggregation.limits"), (
                f"{path.name} imports {node.module}: the bench reaches the node only through "
                "cnode.aggregation's public surface"
            )
            names |= {a.name for a in node.names}
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("cnode") for a in node.names), path.name
    return names


def test_the_bench_imports_the_decision_and_nothing_that_decides_on_its_own() -> None:
    used: set[str] = set()
    for name in FILES:
        used |= _imports(BENCH / name)
    assert "decide_round" in _imports(BENCH / "robustness.py")
    allowed = DECISION | MEASUREMENT | ATTACKS | CODECS | {"SCORE_STEP"}
    assert used <= allowed, f"the bench imports parts of the decision: {sorted(used - allowed)}"
    # Every allowed name is real: a renamed decision cannot leave this test passing on nothing.
    assert all(hasattr(aggregation, n) or n == "SCORE_STEP" for n in used)
    for stale in ("robustness_cell.py", "robustness_summary.py", "_mixing.py"):
        assert not (BENCH / stale).exists(), f"bench/{stale} decided on its own"


def test_a_short_bench_run_goes_through_the_decision() -> None:
    pytest.importorskip("sklearn")
    sys.path.insert(0, str(BENCH))
    try:
        import robustness  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    s = robustness.Setting("scored_clip", "sign_flip", 4, "dirichlet0.3", 0)
    out = robustness.run(s, rounds=4)
    assert out.rounds == 4 and out.empty == 0
    assert out.attacker_scored == 16 and out.attacker_admitted == 0  # sign flip: always out
    assert out.honest_scored == 24
    assert not [b for b in out.bans if not b[3]]  # no honest peer named
