"""One cell of bench/robustness.py's matrix, as one JSON line (issue 24: long runs in chunks).

The 200-round, 3-seed matrix does not fit one invocation on a shared machine; each cell (split,
aggregator, attack, seed) runs alone and appends a JSON line to --out, so chunks add up and
bench/robustness_summary.py reads them back. Prints the line too.

    flock /tmp/cnode-heavy.lock nice -n 5 .venv/bin/python bench/robustness_cell.py \
        --shards iid --attack bar --seed 0 --out results.jsonl
    ... --codec sparse-topk   # every update through the sparse codec, with error feedback
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import structlog
import torch

sys.path.insert(0, str(Path(__file__).parent))
import robustness as rb

from cnode.aggregation import limits


def cell(shards: str, aggregator: str, attack: str, seed: int, rounds: int) -> dict[str, object]:
    """Run one setting; its accuracy, bans, attacker admission and honest standings."""
    f = 0 if attack == "none" else 4
    s = rb.Setting(aggregator, attack, f, shards, seed)
    cfg = (
        rb.scored_config()
        if aggregator in rb.SCORED
        else rb.AggregatorConfig(rb.rule_name(aggregator), {})
    )
    rb.BANS["honest"].clear()
    rb.BANS["attacker"].clear()
    rb.STANDINGS.clear()
    rb.ADMITTED.clear()
    t0 = time.perf_counter()
    acc = rb.run(s, rounds, cfg, 0.0)
    adm = rb.ADMITTED.get((shards, attack), [])
    q = sorted(rb.STANDINGS)
    return {
        "shards": shards,
        "aggregator": aggregator,
        "attack": attack,
        "seed": seed,
        "rounds": rounds,
        "codec": rb.CODEC[0],
        "accuracy": round(acc, 2),
        "honest_bans": [[p, r] for _, p, r in rb.BANS["honest"]],
        "attacker_bans": [[p, r] for _, p, r in rb.BANS["attacker"]],
        "admitted": [sum(adm), len(adm)],
        "honest_standing_p1": q[len(q) // 100] if q else None,
        "honest_below_ban": sum(1 for x in q if x < limits.BAN_REPUTATION),
        "honest_standings": len(q),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", required=True)
    ap.add_argument("--aggregator", default=rb.DEFAULT)
    ap.add_argument("--attack", required=True, help="none (f = 0), absent, or an attack name")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--codec", default="f32", help="update codec (bench/_codec_pass.py)")
    args = ap.parse_args()
    rb.CODEC[0] = rb.wire(args.codec)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)
    line = json.dumps(cell(args.shards, args.aggregator, args.attack, args.seed, args.rounds))
    with args.out.open("a") as fh:
        fh.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
