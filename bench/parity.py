"""Loss parity (issue 26): a cnode swarm against one process that trains on all the data.

* **baseline**: one process, AdamW at the run's lr and batch size, batches drawn from all
  shards, for as many steps as the swarm's nodes take together (the same number of tokens);
  held-out loss after each "round" (every ``nodes x local_steps`` steps).
* **sgd**: 4 real ``cnode train`` nodes (processes, a coordinator process, libp2p on loopback)
  at the run's default settings (outer sgd, outer_lr 1).
* **nesterov**: the same with ``outer_optimizer = "nesterov"`` (DiLoCo's 0.7 / 0.9).
* **attack**: nesterov, 4 honest nodes and one ``--attack gaussian`` node.

Each swarm's held-out loss per round is the "round" report of its first honest node (every
honest node holds the same state, hence the same loss). Runs are separate invocations (each a
few minutes on two cores; heavy-lock each): their figures go to bench/out/parity-<run>.json,
and every invocation prints the table of all runs found there, with each final loss's ratio to
the baseline's.

    flock /tmp/cnode-heavy.lock nice -n 5 .venv/bin/python bench/parity.py --run baseline
    flock /tmp/cnode-heavy.lock nice -n 5 .venv/bin/python bench/parity.py --run nesterov
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
RUNS = ("baseline", "sgd", "nesterov", "attack")
NODES = 4
# The run's model and data: the defaults (the demo's model, ~170 k parameters), which do not
# saturate on the shipped corpus in 30 rounds of 4 nodes (bench/parity.py's figures).
TRAINING: dict[str, Any] = {"partitioned": "auto"}


def _baseline(rounds: int) -> list[float]:
    from cnode.node.train import TextData, TrainingConfig, build_model

    config = TrainingConfig.for_run(dict(TRAINING))
    data = TextData.build(config.data, config.model)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    losses = []
    for _ in range(rounds):
        model.train()
        for _ in range(NODES * config.local_steps):
            pick = torch.randint(0, data.train.shape[0], (config.batch_size,), generator=generator)
            batch = data.train[pick]
            optimizer.zero_grad(set_to_none=True)
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            losses.append(float(model(input_ids=data.eval, labels=data.eval).loss))
    return losses


def _swarm(run: str, rounds: int, timeout_s: float) -> list[float]:
    sys.path.insert(0, str(ROOT))  # the test suite's swarm helper: real processes, bounded waits
    from tests.node.train.swarm import Swarm

    training = dict(TRAINING)
    if run in ("nesterov", "attack"):
        training["outer_optimizer"] = "nesterov"
    # The defaults, over the test helper's tiny model and steps.
    training |= {"model": {}, "data": {}, "local_steps": 16, "batch_size": 8}
    names = [f"honest-{i + 1}" for i in range(NODES)] + (["attacker"] if run == "attack" else [])
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        swarm = Swarm(Path(tmp), names, min_participants=len(names), round_timeout_s=120.0,
                      collect_timeout_s=60.0, training=training)  # fmt: skip
        try:
            for name in names:
                extra = ("--attack", "gaussian") if name == "attacker" else ()
                swarm.start(name, *extra, rounds=rounds, checkpointer=name == "honest-1")
            first = swarm.nodes["honest-1"]
            swarm.wait(f"{rounds} rounds", lambda: first.last_round() >= rounds, timeout_s)
            events = {e["round"]: e["loss"] for e in first.events("round")}
            states = {
                n: swarm.nodes[n].events("round")[-1]["state_cid"]
                for n in names
                if n != "attacker" and swarm.nodes[n].events("round")
            }
            if len(set(states.values())) != 1:
                raise AssertionError(f"honest nodes end on different states: {states}")
            return [events[r] for r in sorted(events)]
        finally:
            swarm.close()


def _table(rounds: int) -> None:
    found = {}
    for run in RUNS:
        path = OUT / f"parity-{run}.json"
        if path.exists():
            found[run] = json.loads(path.read_text())
    if not found:
        return
    shown = [r for r in RUNS if r in found]
    stamps = ", ".join(f"{r}: {found[r]['when']}" for r in shown)
    print(f"\nheld-out loss per round ({stamps})")
    print("round " + " ".join(f"{r:>10s}" for r in shown))
    longest = max(len(found[r]["losses"]) for r in shown)
    for i in range(longest):
        cells = [found[r]["losses"][i] if i < len(found[r]["losses"]) else None for r in shown]
        print(f"{i + 1:5d} " + " ".join(f"{c:10.4f}" if c is not None else " " * 10 for c in cells))
    if "baseline" not in found:
        return
    for run in shown:
        if run == "baseline":
            continue
        n = len(found[run]["losses"])
        base = found["baseline"]["losses"][n - 1]
        final = found[run]["losses"][-1]
        print(f"{run:9s} final loss {final:.4f} after {n} rounds; baseline {base:.4f} at the same "
              f"tokens: ratio {final / base:.4f} ({(final / base - 1):+.2%})")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", choices=RUNS, help="run this one and store its figures")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--timeout-s", type=float, default=1500.0)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)
    if args.run is not None:
        began = time.perf_counter()
        if args.run == "baseline":
            losses = _baseline(args.rounds)
        else:
            losses = _swarm(args.run, args.rounds, args.timeout_s)
        OUT.mkdir(parents=True, exist_ok=True)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        record = {"losses": losses, "seconds": time.perf_counter() - began, "when": when}
        (OUT / f"parity-{args.run}.json").write_text(json.dumps(record))
        print(f"parity: {args.run}: {len(losses)} rounds in {record['seconds']:.0f} s")
    _table(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
