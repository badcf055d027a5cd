"""Loss parity (issue 26): a cnode swarm against one process that trains on all the data.

* **baseline**: one process, AdamW at the run's lr and batch size, batches drawn from all
  shards, for as many steps as the swarm's nodes take together (the same number of tokens);
  held-out loss after each "round" (every ``nodes x local_steps`` steps).
* **sgd**: 4 real ``cnode train`` nodes (processes, a coordinator process, libp2p on loopback)
  at the run's default settings (outer sgd, outer_lr 1, each node keeping its AdamW moments
  across rounds: ``inner_optimizer_state = "keep"``).
* **nesterov**: the same with ``outer_optimizer = "nesterov"`` (DiLoCo's 0.7 / 0.9).
* **attack**: the default settings, 4 honest nodes and one ``--attack gaussian`` node (with
  sgd, the better outer optimizer at the default 16 local steps: docs/benchmarks.md).

``--set KEY=VALUE`` (repeatable; VALUE is TOML, a bare word a string) changes the swarm's
``[training]`` table, and the figures are stored under ``<run>+KEY=VALUE,...``:
``--run nesterov --set outer_lr=0.5 --set outer_momentum=0.6``, ``--run sgd --set
inner_optimizer_state=fresh`` (every round's AdamW fresh, as before the default kept them).

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
import tomllib
from pathlib import Path
from typing import Any

import structlog
import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
SWARMS = ("sgd", "nesterov", "attack")
RUNS = ("baseline", *SWARMS, *(f"{r}-inproc" for r in SWARMS))
NODES = 4
LAST = 5  # the last rounds whose mean is compared too (one round's loss moves by ~1 %)
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


def _swarm(run: str, rounds: int, timeout_s: float, sets: dict[str, Any]) -> list[float]:
    sys.path.insert(0, str(ROOT))  # the test suite's swarm helper: real processes, bounded waits
    from tests.node.train.swarm import Swarm

    training = dict(TRAINING)
    if run == "nesterov":
        training["outer_optimizer"] = "nesterov"
    # The defaults, over the test helper's tiny model and steps.
    training |= {"model": {}, "data": {}, "local_steps": 16, "batch_size": 8} | sets
    names = [f"honest-{i + 1}" for i in range(NODES)] + (["attacker"] if run == "attack" else [])
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        # The honest nodes are enough for a round: once the attacker is banned, the rest go on.
        swarm = Swarm(Path(tmp), names, min_participants=NODES, round_timeout_s=120.0,
                      collect_timeout_s=60.0, training=training)  # fmt: skip
        try:
            for name in names:
                extra = ("--attack", "gaussian") if name == "attacker" else ()
                swarm.start(name, *extra, rounds=rounds, checkpointer=name == "honest-1")
            first = swarm.nodes["honest-1"]
            try:
                swarm.wait(f"{rounds} rounds", lambda: first.last_round() >= rounds, timeout_s)
            except AssertionError:  # out of time: the rounds done so far are still figures
                print(f"parity: {run}: {first.last_round()} of {rounds} rounds in {timeout_s} s")
            events = {e["round"]: e["loss"] for e in first.events("round")}
            honest = [swarm.nodes[n] for n in names if n != "attacker"]
            by_node = [{e["round"]: e["state_cid"] for e in n.events("round")} for n in honest]
            common = min((max(b) for b in by_node if b), default=0)
            states = {b.get(common) for b in by_node}
            if common and len(states) != 1:
                raise AssertionError(f"honest nodes differ after round {common}: {states}")
            return [events[r] for r in sorted(events)]
        finally:
            swarm.close()


def _inprocess(run: str, rounds: int, sets: dict[str, Any], name: str) -> list[float]:
    """The same run with NodeTrainers in this process instead of `cnode train` processes: real
    trainers, signed headers, stores, scores and aggregation, updates passed by copying blocks
    (as tests/node/train/test_round.py does); full replication, no network waits."""
    from cnode.auth import Identity
    from cnode.node.train import NodeTrainer, TrainingConfig, open_update_header
    from cnode.storage import BlockStore, manifest_closure

    training = {**TRAINING, "partitioned": "never"}
    if run == "nesterov":
        training["outer_optimizer"] = "nesterov"
    training |= sets
    config = TrainingConfig.for_run(training)
    attackers = 1 if run == "attack" else 0
    with tempfile.TemporaryDirectory(prefix="parity-inproc-") as tmp:
        nodes = [
            NodeTrainer(
                config,
                run="parity",
                identity=Identity.generate(),
                store=BlockStore(Path(tmp) / f"n{i}"),
                attack="gaussian" if i >= NODES else None,
            )
            for i in range(NODES + attackers)
        ]
        losses = []
        for round_ in range(1, rounds + 1):
            own = [node.train(round_) for node in nodes]
            for node in nodes[:NODES]:  # the honest nodes aggregate
                headers = {}
                for o, src in zip(own, nodes, strict=True):
                    for cid in manifest_closure(src.store, o.header.update):
                        if not node.store.has(cid):
                            node.store.put(cid, src.store.get(cid))
                    node.store.put(o.header_cid, o.envelope)
                    header = open_update_header(o.envelope, run="parity", round_=round_,
                                                signer=src.peer)  # fmt: skip
                    headers[src.peer] = (o.header_cid, header)
                node.aggregate(round_, headers, {})
            if len({n.state_cid for n in nodes[:NODES]}) != 1:
                raise AssertionError(f"round {round_}: the honest nodes' states differ")
            for attacker in nodes[NODES:]:  # it follows the agreed state, as a real one would
                attacker.state, attacker.state_cid = nodes[0].state, nodes[0].state_cid
                attacker.momentum, attacker.round = nodes[0].momentum, round_
            losses.append(nodes[0].evaluate())
            print(f"parity: {name} round {round_}: held-out loss {losses[-1]:.4f}")
            _save(name, losses, partial=round_ < rounds)  # a timeout keeps these
        return losses


def _save(run: str, losses: list[float], *, partial: bool = False) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record = {"losses": losses, "when": when, "partial": partial}
    (OUT / f"parity-{run}.json").write_text(json.dumps(record))


def _table(rounds: int) -> None:
    """Every stored run's curve, and each one's final and last-LAST-rounds ratios."""
    found = {p.stem.removeprefix("parity-"): json.loads(p.read_text())
             for p in sorted(OUT.glob("parity-*.json"))}  # fmt: skip
    if not found:
        return
    shown = sorted(found, key=lambda r: (r != "baseline", r))
    print("\nheld-out loss per round")
    for i, r in enumerate(shown):
        print(f"  [{i}] {r} ({found[r]['when']}{', partial' if found[r]['partial'] else ''})")
    print("round " + " ".join(f"{f'[{i}]':>8s}" for i in range(len(shown))))
    longest = max(len(found[r]["losses"]) for r in shown)
    for i in range(longest):
        cells = [found[r]["losses"][i] if i < len(found[r]["losses"]) else None for r in shown]
        print(f"{i + 1:5d} " + " ".join(f"{c:8.4f}" if c is not None else " " * 8 for c in cells))
    if "baseline" not in found:
        return
    base = found["baseline"]["losses"]
    for run in shown[1:]:
        losses = found[run]["losses"]
        n = len(losses)
        if not n or n > len(base):
            continue
        last = min(LAST, n)
        mean = sum(losses[n - last :]) / sum(base[n - last : n])
        print(f"final {losses[-1]:.4f} after {n} rounds / baseline {base[n - 1]:.4f}: "
              f"{losses[-1] / base[n - 1]:.4f} ({losses[-1] / base[n - 1] - 1:+.2%}); "
              f"last {last} {mean:.4f}  {run}")  # fmt: skip


def _settings(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as a table: VALUE read as TOML, a bare word as a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"parity: --set {pair!r}: KEY=VALUE")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", choices=RUNS, help="run this one and store its figures")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a [training] setting of the run (repeatable)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--timeout-s", type=float, default=1500.0)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)
    sets = _settings(args.set)
    if args.run is not None:
        name = args.run + ("+" + ",".join(args.set) if args.set else "")
        if args.run == "baseline" and sets:
            raise SystemExit("parity: the baseline takes no --set")
        began = time.perf_counter()
        if args.run == "baseline":
            losses = _baseline(args.rounds)
        elif args.run.endswith("-inproc"):
            losses = _inprocess(args.run.removesuffix("-inproc"), args.rounds, sets, name)
        else:
            losses = _swarm(args.run, args.rounds, args.timeout_s, sets)
        _save(name, losses)
        print(f"parity: {name}: {len(losses)} rounds in {time.perf_counter() - began:.0f} s")
    _table(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
