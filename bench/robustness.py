"""Robustness of the node's round decision under attack (issues 4, 10, 12, 24, 36).

n = 10 simulated peers train a small MLP (64-32-10) on scikit-learn's offline digits dataset
(1797 8x8 images, shipped with sklearn: no download): 1400 train the shards, HELD = 150 are the
shared held-out split (scoring only), the other 247 the test set. Each round every peer starts
from the global model, takes LOCAL_STEPS minibatch SGD steps on its shard and sends its parameter
delta; the f attackers (the last f ids) replace theirs with an attack; the global model adds the
aggregate.

**Every decision is the node's** (issue 36): each round goes through
``cnode.aggregation.decide_round``, the function the node's full and partitioned rounds are made
of: admission by the agreed scores, the partition quorum, CenteredClip per partition, the
combined records and the ban evidence of every kind (``RoundEvidence``), each ban enforced from
the next round. What this file adds is only what a bench must: the data, the model, the losses
the scorers measure (``score_update`` turns them into the node's integers) and the attacks.
tests/test_bench_decision.py checks that it imports no other decision.

Rows: "scored_clip" is the swarm's default (scores on, rounds of 10 members partitioned);
"mean" is the plain mean (the baseline), "centered_clip" CenteredClip without scores. Splits:
iid, dirichlet0.3, dirichlet (alpha 0.5), two_classes (peer p holds classes p and p + 5 of a
per-seed permutation, 2 holders a class). Attacks: the classic ones of
``cnode.aggregation.ATTACKS`` and the adaptive ones of bench/_adaptive.py (aimed at the rule as it
is: "bar" stands just above each admission bound, "blind" passes the own floor while harming
held-out data, "stall" is always left out and never harmful enough for a reputation ban).

Prints, per split: final test accuracy (mean over seeds) per attack, the worst gap to the plain
mean without attack (goal <= 5 points), the rounds that applied nothing per cell (goal <= 1 %),
the bans of every kind (goal: 0 honest), and when the stall attacker was banned (goal <= 20).

    flock /tmp/cnode-heavy.lock nice -n 5 .venv/bin/python bench/robustness.py --jobs 2
    .venv/bin/python bench/robustness.py --quick    # one seed, 40 rounds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from _codec_pass import through_codec, wire

from cnode.aggregation import (
    ATTACKS,
    ATTACKS_DATA_LEVEL,
    AggregatorConfig,
    RoundEvidence,
    TensorSpec,
    UpdateScore,
    decide_round,
    draw_indices,
    flip_labels,
    new_attack,
    score_seed,
    score_update,
    scored_config,
    validate_update,
)
from cnode.aggregation.limits import SCORE_STEP

sys.path.insert(0, str(Path(__file__).parent))
from _adaptive import ADAPTIVE, adaptive_update, stall_update
from _digits import (
    CLASSES,
    N_PEERS,
    accuracy,
    forward,
    init_params,
    load_data,
    local_deltas,
    make_shards,
)

SCORE_BATCH = 64  # samples per scoring batch (own and held-out)
DEFAULT = "scored_clip"  # the swarm's default: scores on
ROWS = ("mean", "median", "trimmed_mean", "krum", "centered_clip", DEFAULT)
CLASSIC = ("alie", "ipm", "sign_flip", "label_flip", "gaussian")
MATRIX_ATTACKS = (*CLASSIC, "bar", "blind", "stall")
SPLITS = ("iid", "dirichlet0.3", "dirichlet", "two_classes")


@dataclass(frozen=True)
class Setting:
    row: str
    attack: str  # "none" for f = 0
    f: int
    shards: str  # "iid" | "dirichletA" | "two_classes"
    seed: int
    partitioned: bool = True  # rounds of 10 members are partitioned in a default swarm
    codec: str = "f32"


@dataclass
class Outcome:
    setting: Setting
    accuracy: float
    rounds: int
    empty: int  # rounds that applied nothing
    bans: list[tuple[str, int, str, bool]]  # (peer, round from 1, kind, attacker?)
    attacker_admitted: int  # scored attacker-rounds admitted
    attacker_scored: int
    honest_left_out: int  # scored honest peer-rounds left out
    honest_scored: int


def _digest(update: dict[str, torch.Tensor]) -> str:
    """Stands in for the update header CID in the bench (content-addressed, fixed per update)."""
    return hashlib.sha256(b"".join(update[k].numpy().tobytes() for k in sorted(update))).hexdigest()


def _losses(params: list[dict[str, torch.Tensor]], x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Mean cross-entropy of each parameter set on its batch (x: (P, B, 64)), in float64."""
    p = {k: torch.stack([q[k].double() for q in params]) for k in params[0]}
    with torch.no_grad():
        logits = forward(p, x.double())
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, CLASSES), y.reshape(-1), reduction="none"
        )
    return ce.reshape(len(params), -1).mean(1).tolist()


def _score(
    glob: dict[str, torch.Tensor],
    updates: dict[str, dict[str, torch.Tensor]],
    own: dict[str, tuple[torch.Tensor, torch.Tensor]],
    held: tuple[torch.Tensor, torch.Tensor],
    seed: bytes,
) -> tuple[bytes, dict[str, UpdateScore]]:
    """The scorers' measurement on the MLP: four losses per update on the batches the node draws
    (``draw_indices``), turned into the node's integers by ``score_update``."""
    peers = sorted(updates)
    if not peers:
        return seed, {}
    ox, oy, hx, hy = [], [], [], []
    for p in peers:
        i = torch.tensor(draw_indices(seed, f"own:{p}", len(own[p][1]), SCORE_BATCH))
        ox.append(own[p][0][i])
        oy.append(own[p][1][i])
        j = torch.tensor(draw_indices(seed, "held", len(held[1]), SCORE_BATCH))
        hx.append(held[0][j])
        hy.append(held[1][j])
    after = [{k: glob[k] + SCORE_STEP * updates[p][k] for k in glob} for p in peers]
    x, y = torch.stack(ox + hx), torch.stack(oy + hy)
    before = _losses([glob] * (2 * len(peers)), x, y)
    moved = _losses(after + after, x, y)
    n = len(peers)
    scores = {
        p: score_update(p, before[i], moved[i], before[n + i], moved[n + i])
        for i, p in enumerate(peers)
    }
    return seed, scores


def run(s: Setting, rounds: int) -> Outcome:
    """One setting: ``rounds`` rounds of the swarm, every decision the node's."""
    torch.set_num_threads(1)
    xtr, ytr, xhe, yhe, xte, yte = load_data(s.seed)
    shards = make_shards(ytr, s.shards, s.seed)
    attackers = set(range(N_PEERS - s.f, N_PEERS))  # the last f peer ids
    ids = [f"peer{i:02d}" for i in range(N_PEERS)]
    xs, ys = [xtr[i] for i in shards], [ytr[i] for i in shards]
    own = {ids[i]: (xs[i], ys[i]) for i in range(N_PEERS)}  # the public assignment, true labels
    if s.attack in ATTACKS_DATA_LEVEL:
        ys = [flip_labels(y, CLASSES) if i in attackers else y for i, y in enumerate(ys)]
    glob = init_params(s.seed)
    spec = {k: TensorSpec.of(v) for k, v in glob.items()}
    scored = s.row == DEFAULT
    config = scored_config() if scored else AggregatorConfig(s.row, _params(s.row))
    adaptive = s.attack in ADAPTIVE
    attacks = {a: new_attack(s.attack) for a in attackers} if s.f and not adaptive else {}
    g = torch.Generator().manual_seed(5000 + s.seed)
    rng = torch.Generator().manual_seed(6000 + s.seed)
    residuals: list[dict[str, torch.Tensor] | None] = [None] * N_PEERS
    evidence = RoundEvidence(scored=scored)
    reputation: dict[str, int] = {}
    banned: set[str] = set()
    out = Outcome(s, 0.0, rounds, 0, [], 0, 0, 0, 0)
    for rnd in range(1, rounds + 1):
        sent = local_deltas(glob, xs, ys, g)
        for i in range(N_PEERS) if s.codec != "f32" else []:
            if i not in attackers:
                sent[i], residuals[i] = through_codec(sent[i], residuals[i], s.codec)
        honest = [sent[i] for i in range(N_PEERS) if i not in attackers]
        if s.attack == "stall":  # each its own useless update (bench/_adaptive.py)
            for a in attackers:
                sent[a] = stall_update(sent[a])
        elif adaptive and attackers:
            a0 = min(attackers)
            others = {ids[i]: own[ids[i]] for i in range(N_PEERS) if i not in attackers}
            bad = adaptive_update(
                s.attack, glob, sent[a0], honest, own[ids[a0]], others, (xhe, yhe), rng,
                N_PEERS, s.f, forward=forward, score=_score,
            )  # fmt: skip
            for a in attackers:
                sent[a] = bad
        for a in sorted(attacks):
            sent[a] = attacks[a](honest, sent[a], rng, N_PEERS, s.f)
        for a in attackers if s.codec != "f32" else ():
            sent[a] = through_codec(sent[a], None, s.codec)[0]
        members = [ids[i] for i in range(N_PEERS) if ids[i] not in banned]
        received = {p: sent[ids.index(p)] for p in members}
        scores, seed = None, b""
        if scored:  # the scorers score every update that passes validation (the node's order)
            valid = {p: u for p, u in received.items() if validate_update(u, spec) is None}
            seed = score_seed([f"{p}:{_digest(u)}" for p, u in sorted(received.items())])
            seed, scores = _score(glob, valid, own, (xhe, yhe), seed)
        decision = decide_round(
            rnd, members, received, expected=spec, config=config, evidence=evidence,
            scores=scores, seed=seed, reputation=reputation, partitioned=s.partitioned,
            update_cids={p: _digest(u) for p, u in received.items()},
        )  # fmt: skip
        reputation = decision.reputation
        for p in scores or {}:
            bad = ids.index(p) in attackers
            if bad:
                out.attacker_scored += 1
                out.attacker_admitted += p in decision.inputs
            else:
                out.honest_scored += 1
                out.honest_left_out += p in decision.left_out
        for b in decision.evidence:
            out.bans.append((b.peer, rnd, str(b.kind), ids.index(b.peer) in attackers))
            banned.add(b.peer)  # the coordinator bans it: enforced from the next round
        if decision.aggregate is None:
            out.empty += 1
            continue
        if not all(torch.isfinite(t).all() for t in decision.aggregate.values()):
            break  # the model diverged (rows without scores under gaussian, say)
        glob = {k: glob[k] + decision.aggregate[k] for k in glob}
    out.accuracy = accuracy(glob, xte, yte)
    return out


def _outcome(raw: dict[str, Any]) -> Outcome:
    """An Outcome read back from a --out line."""
    raw = dict(raw)
    raw["setting"] = Setting(**raw["setting"])
    raw["bans"] = [tuple(b) for b in raw["bans"]]
    return Outcome(**raw)


def _params(row: str) -> dict[str, float | str | int]:
    return {"f": 4} if row in ("trimmed_mean", "krum") else {}


def _run(args: tuple[Setting, int]) -> Outcome:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return run(*args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one seed, 40 rounds")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--rows", default=f"mean,{DEFAULT}", help=f"of {','.join(ROWS)}")
    ap.add_argument("--attacks", default=",".join(MATRIX_ATTACKS),
                    help=f"of {','.join(sorted(ATTACKS))},{','.join(ADAPTIVE)}")  # fmt: skip
    ap.add_argument("--shards", default=",".join(SPLITS))
    ap.add_argument("--f", type=int, default=4)
    ap.add_argument("--full", action="store_true", help="full rounds (default: partitioned)")
    ap.add_argument("--codec", default="f32", help="f32 | int8-blockwise | sparse-topk")
    ap.add_argument("--jobs", type=int, default=1, help="settings run in parallel processes")
    ap.add_argument("--out", type=Path, help="append every setting's outcome as a JSON line")
    ap.add_argument("--report", type=Path, help="print the matrix of a --out file; run nothing")
    args = ap.parse_args()
    if args.report:
        lines = args.report.read_text().splitlines()
        done = [_outcome(json.loads(line)) for line in lines if line.strip()]
        first = done[0].setting
        keep = [o for o in done if o.setting.f in (0, args.f)]
        seen = lambda key: sorted({getattr(o.setting, key) for o in keep})  # noqa: E731
        attacks = [a for a in seen("attack") if a != "none"]
        order = [a for a in MATRIX_ATTACKS if a in attacks] + [
            a for a in attacks if a not in MATRIX_ATTACKS
        ]
        rows = [r for r in ROWS if r in seen("row")]
        splits = [x for x in SPLITS if x in seen("shards")]
        ok = report(keep, rows, order, splits, done[0].rounds, len(seen("seed")))
        print(f"goal met: {ok}; {len(done)} settings of {args.report} (codec {first.codec})")
        return 0
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    seeds = list(range(1 if args.quick else args.seeds))
    rounds = 40 if args.quick else args.rounds
    rows, attacks, splits = args.rows.split(","), args.attacks.split(","), args.shards.split(",")
    codec = wire(args.codec)
    settings = [
        Setting(row, attack, f, shards, seed, not args.full, codec)
        for shards in splits
        for row in rows
        for attack, f in [("none", 0)] + ([(a, args.f) for a in attacks] if row != "mean" else [])
        for seed in seeds
    ]
    t0 = time.perf_counter()
    outcomes: list[Outcome] = []
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for o in pool.imap_unordered(_run, [(s, rounds) for s in settings]):
            outcomes.append(o)
            if args.out:
                with args.out.open("a") as fh:
                    fh.write(json.dumps(asdict(o)) + "\n")
            print(f"# {len(outcomes)}/{len(settings)} {o.setting.shards} {o.setting.row} "
                  f"{o.setting.attack} seed {o.setting.seed}: {o.accuracy:.1f} % "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    ok = report(outcomes, rows, attacks, splits, rounds, len(seeds))
    print(f"goal met: {ok}; wall {time.perf_counter() - t0:.0f} s")
    return 0


def report(outcomes: list[Outcome], rows: list[str], attacks: list[str], splits: list[str],
           rounds: int, seeds: int) -> bool:  # fmt: skip
    """Print the matrix and the goals; True when every goal is met."""
    cells: dict[tuple[str, str, str], list[Outcome]] = {}
    for o in outcomes:
        cells.setdefault((o.setting.shards, o.setting.row, o.setting.attack), []).append(o)

    def acc(key: tuple[str, str, str]) -> float:  # NaN for a cell not (yet) run
        return statistics.fmean(o.accuracy for o in cells[key]) if key in cells else math.nan

    def empty(key: tuple[str, str, str]) -> str:
        runs = sorted(cells.get(key, []), key=lambda o: o.setting.seed)
        return "/".join(str(o.empty) for o in runs) or "-"

    print(f"# final test accuracy %, n={N_PEERS}, rounds={rounds}, seeds={seeds}; "
          "in brackets: rounds that applied nothing, per seed")  # fmt: skip
    ok = True
    for shards in splits:
        print(f"\n## {shards}\n")
        print("| row | no attack | " + " | ".join(attacks) + " | worst gap to plain mean |")
        print("|---" * (len(attacks) + 3) + "|")
        ref = acc((shards, "mean", "none")) if (shards, "mean", "none") in cells else None
        for row in rows:
            if row == "mean":
                print(f"| mean | {acc((shards, row, 'none')):.1f} |" + " |" * (len(attacks) + 1))
                continue
            keys = [(shards, row, a) for a in attacks]
            vals = " | ".join(f"{acc(k):.1f} ({empty(k)})" for k in keys)
            gap = (ref - min(acc(k) for k in keys)) if ref is not None else float("nan")
            mark = "**" if row == DEFAULT else ""
            none = (shards, row, "none")
            print(f"| {mark}{row}{mark} | {acc(none):.1f} ({empty(none)}) | {vals} | {gap:.1f} |")
            if row == DEFAULT:
                ok &= gap <= 5.0
    scored = [o for o in outcomes if o.setting.row == DEFAULT]
    print()
    if scored:
        total = sum(o.rounds for o in scored)
        nothing = sum(o.empty for o in scored)
        worst = max(scored, key=lambda o: o.empty / o.rounds)
        print(f"{DEFAULT}: rounds that applied nothing {nothing} of {total} "
              f"({100 * nothing / total:.2f} %); worst cell {worst.setting.shards} "
              f"{worst.setting.attack} seed {worst.setting.seed}: {worst.empty} of "
              f"{worst.rounds} (goal <= 1 % of rounds)")  # fmt: skip
        ok &= worst.empty <= 0.01 * worst.rounds
        honest = [(o.setting, b) for o in scored for b in o.bans if not b[3]]
        kinds: dict[str, int] = {}
        for o in scored:
            for b in o.bans:
                if b[3]:
                    kinds[b[2]] = kinds.get(b[2], 0) + 1
        runs = sum(N_PEERS - o.setting.f for o in scored)
        print(f"honest bans: {len(honest)} in {runs} honest peer-runs (goal 0)"
              + "".join(f"\n  {s.shards} {s.attack} seed {s.seed}: {b[0]} round {b[1]} ({b[2]})"
                        for s, b in honest[:10]))  # fmt: skip
        ok &= not honest
        print(f"attacker bans by kind: {json.dumps(kinds, sort_keys=True)}")
        for attack in ["none", *attacks]:
            of = [o for o in scored if o.setting.attack == attack]
            adm = sum(o.attacker_admitted for o in of)
            tot = sum(o.attacker_scored for o in of)
            # The round by which all of a run's attackers were banned (None: not all were).
            every = [max((b[1] for b in o.bans if b[3]), default=None)
                     if len({b[0] for b in o.bans if b[3]}) == o.setting.f else None
                     for o in of]  # fmt: skip
            banned = [r for r in every if r is not None]
            left = sum(o.honest_left_out for o in of)
            hs = sum(o.honest_scored for o in of)
            print(f"{attack}: attackers admitted {100 * adm / max(tot, 1):.0f} % of scored "
                  f"rounds; runs with every attacker banned {len(banned)} of {len(of)}"
                  + (f" (all banned by round {min(banned)}..{max(banned)})" if banned else "")
                  + f"; honest left out {100 * left / max(hs, 1):.1f} %")  # fmt: skip
            if attack == "stall":
                ok &= len(banned) == len(of) and max(banned, default=99) <= 20
    return ok


if __name__ == "__main__":
    sys.exit(main())
