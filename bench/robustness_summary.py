"""Summarise the JSON lines of bench/robustness_cell.py (issue 24's 200-round matrix).

Per split: the plain mean without attack (the baseline), scored_clip per attack (mean over the
seeds present), each cell's gap to the baseline (two classes: to the attackers-absent run), the
honest bans, each adaptive attacker's admission rate and ban rounds, and the honest false-ban
rate per peer-run. Cells missing from the file are named, so a partial matrix says what it lacks.

    .venv/bin/python bench/robustness_summary.py bench/results/robustness_rev4_h200_20261127.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

SPLITS = ("iid", "dirichlet0.3", "dirichlet", "two_classes")
ADAPTIVE = ("blind", "bar", "alie_adaptive", "inflate")
N_PEERS, F = 10, 4


def main(path: Path) -> int:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cells = {(r["shards"], r["aggregator"], r["attack"], r["seed"]): r for r in rows}
    ok, honest_runs, honest_bans = True, 0, 0
    for sh in SPLITS:
        base = [cells[k]["accuracy"] for k in cells if k[:3] == (sh, "mean", "none")]
        attacks = sorted({k[2] for k in cells if k[0] == sh and k[1] == "scored_clip"})
        if not base or not attacks:
            print(f"\n## {sh}: missing (no plain-mean or scored cells)")
            continue
        ref = statistics.fmean(base)
        print(f"\n## {sh}: plain mean, no attack {ref:.1f} ({len(base)} seeds)\n")
        print("| attack | scored_clip | seeds | gap | honest bans | attacker admitted | bans |")
        print("|---|---|---|---|---|---|---|")
        absent = [cells[k]["accuracy"] for k in cells if k[:3] == (sh, "scored_clip", "absent")]
        for a in attacks:
            runs = [cells[k] for k in sorted(cells) if k[:3] == (sh, "scored_clip", a)]
            acc = statistics.fmean(r["accuracy"] for r in runs)
            goal_ref = statistics.fmean(absent) if sh == "two_classes" and absent else ref
            gap = goal_ref - acc
            hb = [(r["seed"], p, n) for r in runs for p, n in r["honest_bans"]]
            honest_runs += len(runs) * (N_PEERS if a == "none" else N_PEERS - F)
            honest_bans += len(hb)
            adm = sum(r["admitted"][0] for r in runs), sum(r["admitted"][1] for r in runs)
            rate = f"{100 * adm[0] / adm[1]:.0f} %" if adm[1] else "-"
            bans = "; ".join(
                f"s{r['seed']}: " + (",".join(str(n) for _, n in sorted(r["attacker_bans"],
                                                                       key=lambda b: b[1])) or "-")
                for r in runs
            )  # fmt: skip
            if a == "none":
                ok &= acc >= ref - 1.0
            elif a != "absent":
                ok &= gap <= 5.0
            ok &= not hb
            print(f"| {a} | {acc:.1f} | {len(runs)} | {gap:.1f} | {hb or 0} | {rate} | {bans} |")
    print(
        f"\nhonest bans: {honest_bans} of {honest_runs} honest peer-runs "
        f"({100 * honest_bans / max(1, honest_runs):.2f} %); goals met: {ok}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
