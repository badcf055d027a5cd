"""Members behind NAT as fast as public ones (issue 37): 5 ``cnode train`` nodes in the NAT
testbed (tests/support/nattestbed.py: network namespaces, each private host behind its own
nft-masquerading router, no port forwarding), every upload capped at ``--mbit`` (50 Mbit/s),
the coordinator on a sixth, public host.

For each model (``demo``: the default run's; ``10m``: bench/round.py's 10.2M-parameter GPT-2),
with the update codec a new run gets (``--codec f32`` for the earlier measurement's), the same
swarm runs twice, in the same invocation: all 5 nodes public (the baseline), then 3 of
the 5 behind NAT. Nothing of the round is re-implemented: the figures are the nodes' own round
reports (the round event):

* overhead   per node and round, ``assembled_at`` minus the latest ``published_at`` of the
             round's members; median over nodes and rounds, round 1 left out (warm-up);
* reserved   bytes the public members fetched per round to re-serve outbound-only members'
             updates (``reserved_bytes``; node/train/exchange/_relay.py): what crossed a
             re-serving holder (no circuit relay is used);
* left out   rounds where an update was left out of the agreed set, and states (distinct state
             CIDs per round: 1 everywhere is agreement).

It prints the ratio NAT / all-public per model (goal: <= 1.3). Needs root, iproute2, nftables:

    flock /tmp/cnode-heavy.lock timeout 3000 .venv/bin/python bench/nat.py --models demo 10m
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from cnode.node import new_run_training
from tests.support.natswarm import NatSwarm, overheads
from tests.support.nattestbed import NatTestbed, why_not_available

MODELS: dict[str, dict[str, Any]] = {
    "demo": {},  # the default run's model and settings
    "10m": {
        "model": {"n_layer": 6, "n_embd": 368, "n_head": 4, "n_positions": 64},
        "local_steps": 1,
        "batch_size": 4,
        "data": {"eval_sequences": 8},
    },
}
ROUNDS_CONFIG: dict[str, Any] = {
    "round_timeout_s": 60.0,
    "checkpoint_every": 1,
    "cooldown_s": 30.0,
    "warmup_s": 1.0,
    "collect_timeout_s": 60.0,
}


def one_swarm(
    model: str, natted: int, rounds: int, mbit: int, codec: str | None, keep: Path | None
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"nat-{model}-{natted}-", dir=keep))
    bed = NatTestbed(public=1 + 5 - natted, private=natted, rate_mbit=mbit)
    bed.up()
    # The update codec a new run gets (cnode coordinator new-run), unless --codec names another.
    training = {**new_run_training(*([codec] if codec else [])), **MODELS[model]}
    swarm = NatSwarm(tmp, bed, rounds={"min_participants": 5, **ROUNDS_CONFIG}, training=training)
    names = [f"p{i}" for i in range(5 - natted)] + [f"n{i}" for i in range(natted)]
    try:
        for name in names:
            swarm.add(name, public=name.startswith("p"))
        swarm.start_coordinator()
        began = time.monotonic()
        for i, name in enumerate(names):
            swarm.start(name, *(["--checkpointer"] if i == 0 else []), rounds=rounds)
        codes = {name: swarm.wait_exit(name, timeout=3000) for name in names}
        wall = time.monotonic() - began
        rows = [e for n in names for e in swarm.events(n, "round") if e["round"] > 1]
        ov = [o for o, e in zip(overheads(swarm, names), _all_rounds(swarm, names), strict=True)
              if e["round"] > 1]  # fmt: skip
        per_round: dict[int, int] = {}
        states: dict[int, set[str]] = {}
        left_out = set()
        for e in [e for n in names for e in swarm.events(n, "round")]:
            per_round[e["round"]] = per_round.get(e["round"], 0) + int(e.get("reserved_bytes", 0))
            states.setdefault(e["round"], set()).add(e["state_cid"])
            if e.get("dropped"):
                left_out.add(e["round"])
        return {
            "model": model,
            "natted": natted,
            "exit_codes": codes,
            "wall_s": round(wall, 1),
            "rounds_done": len({e["round"] for e in rows}) + 1,
            "overhead_median_s": round(statistics.median(ov), 2) if ov else None,
            "overhead_range_s": [round(min(ov), 2), round(max(ov), 2)] if ov else None,
            "reserved_bytes_per_round": per_round,
            "rounds_with_update_left_out": sorted(left_out),
            "states_per_round": {r: len(s) for r, s in sorted(states.items())},
            "holder_dial_drops": sum(
                1
                for n in names
                for line in swarm.log_lines(n, "holder_dropped")
                if '"dial"' in line
            ),
        }
    finally:
        swarm.close()
        bed.down()
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def _all_rounds(swarm: NatSwarm, names: list[str]) -> list[dict[str, Any]]:
    return [e for n in names for e in swarm.events(n, "round")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["demo", "10m"], choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--mbit", type=int, default=50)
    parser.add_argument("--keep", type=Path, default=None, help="keep the homes under this dir")
    parser.add_argument(
        "--codec", default=None, help="update codec (default: what a new run gets, sparse-topk)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    why = why_not_available()
    if why is not None:
        print(f"bench/nat.py: {why}", file=sys.stderr)
        return 2
    results = []
    for model in args.models:
        base = one_swarm(model, 0, args.rounds, args.mbit, args.codec, args.keep)
        nat = one_swarm(model, 3, args.rounds, args.mbit, args.codec, args.keep)
        ratio = None
        if base["overhead_median_s"] and nat["overhead_median_s"] is not None:
            ratio = round(nat["overhead_median_s"] / base["overhead_median_s"], 2)
        for r in (base, nat):
            print(
                f"{model:5} {r['natted']} of 5 NATed: publish->assembled median "
                f"{r['overhead_median_s']} s (range {r['overhead_range_s']}), rounds "
                f"{r['rounds_done']}, left out in rounds {r['rounds_with_update_left_out']}, "
                f"states/round {r['states_per_round']}, reserved bytes/round "
                f"{r['reserved_bytes_per_round']}, dial drops {r['holder_dial_drops']}, "
                f"exit {sorted(set(r['exit_codes'].values()))}"
            )
        print(f"{model:5} NAT / all public: {ratio} (goal <= 1.3)")
        results.append({"model": model, "all_public": base, "nat": nat, "ratio": ratio})
    if args.json:
        print(json.dumps({"mbit": args.mbit, "rounds": args.rounds, "codec": args.codec,
                          "results": results}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
