"""Robustness of every aggregator under every attack (issues 4, 10, 12).

n = 10 simulated peers train a small MLP (64-32-10) on scikit-learn's offline digits dataset
(1797 8x8 images, shipped with sklearn: no download): 1400 train the shards, HELD = 150 are the
shared held-out split (scoring only), the other 247 the test set. Each round every peer starts
from the global model, takes LOCAL_STEPS minibatch SGD steps on its shard and sends its parameter
delta (or its worker momentum, --momentum); the f attackers (the last f ids) replace theirs with
an attack from cnode.aggregation.ATTACKS; the global model adds the aggregate. Shards: iid,
dirichlet (Dirichlet(0.5) class mix per peer) or two_classes (peer p holds classes p and p + 5 of
a per-seed class permutation). Prints final test accuracy (mean over seeds) for every attack x
aggregator, the gap of the default to its no-attack run (goal <= 5 points) and to the plain mean
without attack (goal <= 1; "absent", the f peers sending nothing, is the honest-only ceiling).

Rows: "scored_clip" is the default as node/train runs it with training.scores: every update is
scored on its sender's assigned data and the shared held-out split (seed: sha256 of the round's
update digests, standing in for header CIDs), reputations are kept, admitted updates go to
CenteredClip (cnode.aggregation.scored_config). "centered_clip" is the previous default
(within-round only), "centered_clip_weighted" it with weights = shard sizes. --mode partitioned
aggregates each of N_PEERS contiguous partitions apart (aggregate_partition) with SEGMENT = 64
values per segment: the MLP's 2410 values make 38 segments, 3 or 4 per partition, so partitions
differ by at most one segment, as with real models whose partitions hold many segments of
SEGMENT_VALUES. --pre nnm | bucket2 are bench-only experiments (bench/_mixing.py). --codec
sends every update through an update codec with error feedback (bench/_codec_pass.py).

    nice -n 5 .venv/bin/python bench/robustness.py --mode full,partitioned --json  # ~4 min
    .venv/bin/python bench/robustness.py --quick    # one seed, 20 rounds, ~12 s
    .venv/bin/python bench/robustness.py --codec sparse-topk --aggregators mean,scored_clip
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from _codec_pass import through_codec, wire
from sklearn.datasets import load_digits

from cnode.aggregation import (
    ATTACKS,
    ATTACKS_DATA_LEVEL,
    AggregatorConfig,
    NotEnoughUpdatesError,
    ReputationPolicy,
    TensorSpec,
    UpdateScore,
    admit,
    aggregate,
    draw_indices,
    flip_labels,
    new_attack,
    score_seed,
    score_update,
    scored_config,
    update_reputation,
    validate_update,
    worker_momentum,
)
from cnode.aggregation.limits import SCORE_STEP

sys.path.insert(0, str(Path(__file__).parent))
from _mixing import aggregate_partitioned, bucket, nnm

N_PEERS = 10
HIDDEN = 32
LOCAL_STEPS = 5
BATCH = 32
LR = 0.3
CLASSES = 10
DIRICHLET_ALPHA = 0.5
HELD = 150  # shared held-out images (scoring only); the test set is what remains (247)
SCORE_BATCH = 64  # samples per scoring batch (own and held-out)
# Partitioned mode: segment of 64 values, so the 2410-value MLP has 38 segments and each of the
# N_PEERS partitions 3 or 4 (sizes within one segment of each other, as with real models whose
# partitions hold many SEGMENT_VALUES segments).
SEGMENT = 64
AGGREGATORS = [
    "mean",
    "weighted_mean",
    "median",
    "trimmed_mean",
    "krum",
    "centered_clip",
    "centered_clip_weighted",
    "scored_clip",
]
# The default aggregator as node/train calls it: scores and reputation admit updates, then
# CenteredClip without distance rejection (specs/aggregation.md "Scores and reputation").
DEFAULT = "scored_clip"
# Rows that score updates and admit by reputation first.
SCORED = {"scored_clip"}
# Rows given weights = shard sizes (samples processed; the other rules ignore weights). A weight
# is the sender's own claim: "centered_clip_weighted" shows what trusting it costs.
WEIGHTED = {"weighted_mean", "centered_clip_weighted"}


def rule_name(row: str) -> str:
    return "centered_clip" if row in ("centered_clip_weighted", "scored_clip") else row


@dataclass(frozen=True)
class Setting:
    aggregator: str
    attack: str  # "none" for f = 0
    f: int
    shards: str  # "iid" | "dirichlet" | "two_classes"
    seed: int
    pre: str = "none"  # bench-only transform before aggregate(): "none" | "nnm" | "bucketS"
    mode: str = "full"  # "full" replication | "partitioned" (aggregate_partition per partition)


Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def load_data(seed: int) -> Data:
    """Train (1400: the shards), shared held-out (HELD images: scoring only), test (the rest)."""
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1000 + seed))
    x, y = x[perm], y[perm]
    h = 1400 + HELD
    return x[:1400], y[:1400], x[1400:h], y[1400:h], x[h:], y[h:]


def make_shards(y: torch.Tensor, kind: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + seed)
    if kind == "iid":
        perm = torch.randperm(len(y), generator=g)
        return list(perm.chunk(N_PEERS))
    if kind == "two_classes":
        # Peer p holds classes c(p) and c(p + 5) (c a per-seed permutation of the classes), each
        # class split equally between its two holders: every class has an honest holder for any
        # f <= 5 attackers taken from the last ids, and attackers co-hold 8 of the 10 classes.
        cls = torch.randperm(CLASSES, generator=g).tolist()
        owned: list[list[int]] = [[] for _ in range(N_PEERS)]
        for c in range(CLASSES):
            holders = [p for p in range(N_PEERS) if c in (cls[p % 10], cls[(p + 5) % 10])]
            idx = (y == c).nonzero().flatten()
            idx = idx[torch.randperm(len(idx), generator=g)]
            for k, part in enumerate(idx.chunk(len(holders))):
                owned[holders[k]].extend(part.tolist())
        return [torch.tensor(sorted(p)) for p in owned]
    parts: list[list[int]] = [[] for _ in range(N_PEERS)]
    conc = torch.full((N_PEERS,), DIRICHLET_ALPHA)
    for c in range(CLASSES):
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        torch.manual_seed(3000 + seed * 17 + c)
        share = torch.distributions.Dirichlet(conc).sample()
        cuts = (share.cumsum(0) * len(idx)).round().long().tolist()
        prev = 0
        for p, cut in enumerate(cuts):
            parts[p].extend(idx[prev:cut].tolist())
            prev = cut
    return [torch.tensor(sorted(p) or [0]) for p in parts]


def init_params(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4000 + seed)
    return {
        "b1": torch.zeros(HIDDEN),
        "b2": torch.zeros(CLASSES),
        "w1": torch.randn(64, HIDDEN, generator=g) * (1 / 8),
        "w2": torch.randn(HIDDEN, CLASSES, generator=g) * (1 / HIDDEN**0.5),
    }


def forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    # x: (P, B, 64), params batched over peers (P, ...)
    h = torch.relu(torch.bmm(x, p["w1"]) + p["b1"].unsqueeze(1))
    return torch.bmm(h, p["w2"]) + p["b2"].unsqueeze(1)


def local_deltas(
    glob: dict[str, torch.Tensor],
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    g: torch.Generator,
) -> list[dict[str, torch.Tensor]]:
    """LOCAL_STEPS of minibatch SGD on every peer at once; returns each peer's delta."""
    local = {
        k: v.unsqueeze(0).repeat(N_PEERS, *[1] * v.dim()).requires_grad_() for k, v in glob.items()
    }
    for _ in range(LOCAL_STEPS):
        idx = [torch.randint(len(y), (BATCH,), generator=g) for y in ys]
        xb = torch.stack([x[i] for x, i in zip(xs, idx, strict=True)])
        yb = torch.stack([y[i] for y, i in zip(ys, idx, strict=True)])
        logits = forward(local, xb)
        loss = (
            torch.nn.functional.cross_entropy(logits.reshape(-1, CLASSES), yb.reshape(-1)) * N_PEERS
        )
        grads = torch.autograd.grad(loss, list(local.values()))
        with torch.no_grad():
            local = {
                k: (v - LR * gr).requires_grad_()
                for (k, v), gr in zip(local.items(), grads, strict=True)
            }
    return [{k: (local[k][i] - glob[k]).detach() for k in glob} for i in range(N_PEERS)]


def accuracy(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        logits = forward({k: v.unsqueeze(0) for k, v in p.items()}, x.unsqueeze(0))[0]
    return float((logits.argmax(1) == y).float().mean()) * 100


# Reputation ban recommendations seen by the scored rows: (setting, peer, round from 1).
BANS: dict[str, list[tuple[Setting, str, int]]] = {"honest": [], "attacker": []}


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


def score_round(
    glob: dict[str, torch.Tensor],
    updates: dict[str, dict[str, torch.Tensor]],
    own: dict[str, tuple[torch.Tensor, torch.Tensor]],
    held: tuple[torch.Tensor, torch.Tensor],
) -> tuple[bytes, dict[str, UpdateScore]]:
    """The round's seed and every update's score (own assigned batch, shared held-out batch)."""
    peers = sorted(updates)
    seed = score_seed([f"{p}:{_digest(updates[p])}" for p in peers])
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


# --codec, as its wire string (one setting per invocation; a list so main() can set it).
CODEC = ["f32"]


def run(s: Setting, rounds: int, config: AggregatorConfig, beta: float) -> float:
    xtr, ytr, xhe, yhe, xte, yte = load_data(s.seed)
    shards = make_shards(ytr, s.shards, s.seed)
    attackers = list(range(N_PEERS - s.f, N_PEERS))  # the last f peer ids
    xs = [xtr[i] for i in shards]
    ys = [ytr[i] for i in shards]
    ids = [f"peer{i:02d}" for i in range(N_PEERS)]
    own = {ids[i]: (xs[i], ys[i]) for i in range(N_PEERS)}  # the public assignment, true labels
    ys = list(ys)
    if s.attack in ATTACKS_DATA_LEVEL:
        for a in attackers:
            ys[a] = flip_labels(ys[a], CLASSES)
    glob = init_params(s.seed)
    spec = {k: TensorSpec.of(v) for k, v in glob.items()}
    weights = {ids[i]: float(len(shards[i])) for i in range(N_PEERS)}
    absent = s.attack == "absent"  # the f peers simply do not take part: the honest-only ceiling
    attacks = {a: new_attack(s.attack) for a in attackers} if s.f and not absent else {}
    g = torch.Generator().manual_seed(5000 + s.seed)
    rng = torch.Generator().manual_seed(6000 + s.seed)
    momenta: list[dict[str, torch.Tensor] | None] = [None] * N_PEERS
    residuals: list[dict[str, torch.Tensor] | None] = [None] * N_PEERS
    prev = None
    reputation: dict[str, int] = {}
    policy = ReputationPolicy()
    for rnd in range(rounds):
        deltas = local_deltas(glob, xs, ys, g)
        if beta > 0:
            momenta = [worker_momentum(m, d, beta) for m, d in zip(momenta, deltas, strict=True)]
            sent = list(momenta)
        else:
            sent = list(deltas)
        for i in range(N_PEERS) if CODEC[0] != "f32" else []:
            if i not in attackers:
                sent[i], residuals[i] = through_codec(sent[i], residuals[i], CODEC[0])
        honest = [sent[i] for i in range(N_PEERS) if i not in attackers]
        for a in attackers if not absent else []:
            sent[a] = attacks[a](honest, sent[a], rng, N_PEERS, s.f)
            if CODEC[0] != "f32":
                sent[a] = through_codec(sent[a], None, CODEC[0])[0]
        present = [i for i in range(N_PEERS) if not (absent and i in attackers)]
        received = {ids[i]: sent[i] for i in present}
        if s.aggregator in SCORED:
            valid = {p: u for p, u in received.items() if validate_update(u, spec) is None}
            seed, scores = score_round(glob, valid, own, (xhe, yhe))
            reputation = update_reputation(reputation, {p: v.score for p, v in scores.items()})
            for rec in policy.observe(rnd, seed, scores, reputation):
                bad = ids.index(rec.peer) in attackers
                BANS["attacker" if bad else "honest"].append((s, rec.peer, rnd + 1))
            received = {
                p: received[p] for p in admit({p: v.score for p, v in scores.items()}, reputation)
            }
            if not received:
                continue
        use = {p: weights[p] for p in received} if s.aggregator in WEIGHTED else None
        if s.pre == "nnm":
            received = nnm(received)
        elif s.pre.startswith("bucket"):
            received, use = bucket(received, int(s.pre.removeprefix("bucket")), rnd), None
        try:
            if s.mode == "partitioned":
                agg = aggregate_partitioned(received, glob, config, N_PEERS, SEGMENT)
            else:
                res = aggregate(received, expected=spec, config=config, weights=use, previous=prev)
                agg = res.tensors
        except NotEnoughUpdatesError:  # the model diverged: honest updates are NaN too
            break
        prev = agg
        glob = {k: glob[k] + agg[k] for k in glob}
    return accuracy(glob, xte, yte)


def _or_default(value: object) -> object:
    return "default" if value is None else value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one seed, 20 rounds")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--momentum", type=float, default=0.0, help="worker momentum beta (0 = off)")
    ap.add_argument("--tau-scale", type=float, default=None, help="CenteredClip tau_scale")
    ap.add_argument("--reject-score", type=float, default=None, help="CenteredClip reject_score")
    ap.add_argument("--start", default=None, help="CenteredClip start: median | previous")
    ap.add_argument(
        "--scored-reject", type=float, default=None, help="reject_score of scored_clip (default 0)"
    )
    ap.add_argument(
        "--pre", default="none", help="bench-only transform before aggregation: nnm | bucketS"
    )
    ap.add_argument("--aggregators", default="mean,centered_clip,scored_clip", help="or 'all'")
    ap.add_argument("--attacks", default=",".join(["absent", *sorted(ATTACKS)]))
    ap.add_argument("--shards", default="iid,dirichlet,two_classes")
    ap.add_argument("--f", default="4", help="attacker counts (comma-separated)")
    ap.add_argument("--mode", default="full", help="full | partitioned | full,partitioned")
    ap.add_argument("--json", action="store_true", help="end with one JSON line (default row)")
    ap.add_argument(
        "--codec", default="f32", help="update codec: f32 | int8-blockwise | sparse-topk"
    )
    args = ap.parse_args()
    CODEC[0] = wire(args.codec)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)

    seeds = list(range(1 if args.quick else args.seeds))
    rounds = 20 if args.quick else args.rounds
    fs = [int(x) for x in args.f.split(",")]
    aggs = AGGREGATORS if args.aggregators == "all" else args.aggregators.split(",")
    attacks = args.attacks.split(",")
    shard_kinds = args.shards.split(",")
    modes = args.mode.split(",")
    real = [a for a in attacks if a != "absent"]  # "absent" is a ceiling, not an attack

    def cfg(row: str) -> AggregatorConfig:
        name = rule_name(row)
        params: dict[str, float | str] = {}
        if name == "centered_clip" and args.tau_scale is not None:
            params["tau_scale"] = args.tau_scale
        if name == "centered_clip" and args.reject_score is not None:
            params["reject_score"] = args.reject_score
        if name == "centered_clip" and args.start is not None:
            params["start"] = args.start
        if row in SCORED:
            params = {**scored_config().params, **params}
            if args.scored_reject is not None:
                params["reject_score"] = args.scored_reject
        return AggregatorConfig(name, params)

    t0 = time.perf_counter()
    table: dict[tuple[str, str, str, int, str], float] = {}
    for mode in modes:
        for shards in shard_kinds:
            for agg in aggs:
                for attack, f in [("none", 0)] + [(a, f) for f in fs for a in attacks]:
                    accs = [
                        run(
                            Setting(agg, attack, f, shards, sd, args.pre, mode),
                            rounds,
                            cfg(agg),
                            args.momentum,
                        )
                        for sd in seeds
                    ]
                    table[(mode, shards, agg, f, attack)] = statistics.fmean(accs)
            print(f"# {mode} {shards} done after {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    print(
        f"# final test accuracy %, n={N_PEERS}, rounds={rounds}, seeds={len(seeds)}, "
        f"momentum={args.momentum}, tau_scale={_or_default(args.tau_scale)}, "
        f"reject_score={_or_default(args.reject_score)}, start={_or_default(args.start)}, "
        f"pre={args.pre}, scored_reject={args.scored_reject}, codec={CODEC[0]}"
    )
    for mode in modes:
        for shards in shard_kinds:
            for f in fs:
                print(f"\n## {mode}, {shards}, f={f} (no-attack column: f=0)\n")
                print("| aggregator | no attack | " + " | ".join(attacks) + " | worst gap |")
                print("|---" * (len(attacks) + 3) + "|")
                for agg in aggs:
                    base = table[(mode, shards, agg, 0, "none")]
                    vals = [table[(mode, shards, agg, f, a)] for a in attacks]
                    gap = base - min(table[(mode, shards, agg, f, a)] for a in real)
                    cells = " | ".join(f"{v:.1f}" for v in vals)
                    mark = "**" if agg == DEFAULT else ""
                    print(f"| {mark}{agg}{mark} | {base:.1f} | {cells} | {gap:.1f} |")
    print()
    ok = True
    f = max(fs)
    for mode in modes if DEFAULT in aggs else []:
        for shards in shard_kinds:
            base = table[(mode, shards, DEFAULT, 0, "none")]
            worst = min(real, key=lambda a: table[(mode, shards, DEFAULT, f, a)])
            gap = base - table[(mode, shards, DEFAULT, f, worst)]
            ok &= gap <= 5.0
            line = (
                f"{DEFAULT} {mode} {shards} f={f}: no-attack {base:.1f}, worst {worst} "
                f"{table[(mode, shards, DEFAULT, f, worst)]:.1f}, gap {gap:.1f} (goal <= 5)"
            )
            if "mean" in aggs:
                mean_base = table[(mode, shards, "mean", 0, "none")]
                ok &= base >= mean_base - 1.0
                line += f"; plain mean no-attack {mean_base:.1f} (goal: within 1)"
            print(line)
    if "full" in modes and "partitioned" in modes and DEFAULT in aggs:
        for shards in shard_kinds:
            loss = max(
                table[("full", shards, DEFAULT, f, a)]
                - table[("partitioned", shards, DEFAULT, f, a)]
                for a in real
            )
            ok &= loss <= 1.0
            print(f"partitioned vs full, {shards}: at most {loss:.1f} points worse (goal <= 1)")
    honest_bans = BANS["honest"]
    ok &= not honest_bans
    late = [b for b in BANS["attacker"] if b[2] > 3]
    print(
        f"reputation bans: honest peers {len(honest_bans)} (goal 0)"
        + "".join(f"\n  {b[0]} {b[1]} round {b[2]}" for b in honest_bans[:5])
        + f"; attackers {len(BANS['attacker'])}, of them after round 3: {len(late)} "
        f"({', '.join(sorted({b[0].attack for b in BANS['attacker']}))})"
    )
    print(f"goal met: {ok}; wall {time.perf_counter() - t0:.0f} s")
    if args.json and DEFAULT in aggs:
        mode = modes[0]
        out = {
            "f": f,
            "mode": mode,
            "splits": {
                sh: {"none": round(table[(mode, sh, DEFAULT, 0, "none")], 2)}
                | {a: round(table[(mode, sh, DEFAULT, f, a)], 2) for a in real}
                for sh in shard_kinds
            },
            "mean_no_attack": {
                sh: round(table[(mode, sh, "mean", 0, "none")], 2)
                for sh in shard_kinds
                if "mean" in aggs
            },
        }
        print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
