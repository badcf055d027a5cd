"""Robustness of every aggregator under every attack (issue 4).

n = 10 simulated peers train a small MLP (64-32-10) on scikit-learn's offline digits dataset
(1797 8x8 images, shipped with sklearn: no download). Each round every peer starts from the global
model, takes LOCAL_STEPS minibatch SGD steps on its shard and sends its parameter delta (or its
worker momentum of deltas, --momentum); the f attackers replace theirs with an attack from
cnode.aggregation.ATTACKS; the global model adds the aggregate. Shards are iid or non-iid
(Dirichlet(alpha=0.5) class mix per peer). Prints final test accuracy (mean over seeds) for
every attack x aggregator at f in {0, 2, 4}, and the worst gap of the default aggregator to the
no-attack run at f = 4 (goal: <= 5 points; "absent", the f peers sending nothing, is the
honest-only ceiling and not counted as an attack).

Rows: the rules of cnode.aggregation; "centered_clip" is the default as node/train calls it (no
weights), "centered_clip_weighted" the same rule given weights = shard sizes (a sender's own
claim). --start, --tau-scale and --reject-score change CenteredClip's parameters; --pre nnm or
--pre bucket2 mix the updates before aggregation (bench-only experiments, see
specs/aggregation.md "Non-iid shards").

    .venv/bin/python bench/robustness.py            # full table (a few minutes on 2 cores)
    .venv/bin/python bench/robustness.py --quick    # f=4 only, one seed, fewer rounds
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import dataclass

import structlog
import torch
from sklearn.datasets import load_digits

from cnode.aggregation import (
    ATTACKS,
    ATTACKS_DATA_LEVEL,
    AggregatorConfig,
    NotEnoughUpdatesError,
    TensorSpec,
    aggregate,
    flip_labels,
    new_attack,
    worker_momentum,
)

N_PEERS = 10
HIDDEN = 32
LOCAL_STEPS = 5
BATCH = 32
LR = 0.3
CLASSES = 10
DIRICHLET_ALPHA = 0.5
AGGREGATORS = [
    "mean",
    "weighted_mean",
    "median",
    "trimmed_mean",
    "krum",
    "centered_clip",
    "centered_clip_weighted",
]
# The default aggregator as node/train calls it: AggregatorConfig() and no weights.
DEFAULT = "centered_clip"
# Rows given weights = shard sizes (samples processed; the other rules ignore weights). A weight
# is the sender's own claim: "centered_clip_weighted" shows what trusting it costs.
WEIGHTED = {"weighted_mean", "centered_clip_weighted"}


def rule_name(row: str) -> str:
    return "centered_clip" if row == "centered_clip_weighted" else row


@dataclass(frozen=True)
class Setting:
    aggregator: str
    attack: str  # "none" for f = 0
    f: int
    shards: str  # "iid" | "noniid"
    seed: int
    pre: str = "none"  # bench-only transform before aggregate(): "none" | "nnm" | "bucketS"


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1000 + seed))
    x, y = x[perm], y[perm]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def make_shards(y: torch.Tensor, kind: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + seed)
    if kind == "iid":
        perm = torch.randperm(len(y), generator=g)
        return list(perm.chunk(N_PEERS))
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


def _flat(update: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([update[k].double().reshape(-1) for k in sorted(update)])


def _unflat(vec: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, off = {}, 0
    for k in sorted(like):
        t = like[k]
        out[k] = vec[off : off + t.numel()].reshape(t.shape).to(t.dtype)
        off += t.numel()
    return out


def nnm(updates: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    """Nearest neighbour mixing (Allouah et al. 2023): each update becomes the mean of its n - f
    nearest updates (itself included; ties by peer id), f = the most below n/2 (the aggregator
    does not know the true f). Bench-only experiment; not deterministic across thread counts."""
    ids = sorted(updates)
    x = torch.stack([_flat(updates[p]) for p in ids])
    keep = len(ids) - (len(ids) - 1) // 2
    out = {}
    for i, p in enumerate(ids):
        d = ((x - x[i]) ** 2).sum(1).tolist()
        near = sorted(range(len(ids)), key=lambda j: (d[j], j))[:keep]
        out[p] = _unflat(x[near].mean(0), updates[p])
    return out


def bucket(
    updates: dict[str, dict[str, torch.Tensor]], size: int, seed: int
) -> dict[str, dict[str, torch.Tensor]]:
    """Bucketing (Karimireddy, He & Jaggi 2022): a permutation seeded by public round data
    (here the round number) cuts the sorted peers into buckets of ``size``; each bucket's mean is
    one input of the robust rule. Bench-only experiment."""
    ids = sorted(updates)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).tolist()
    out = {}
    for b in range(0, len(ids), size):
        group = [ids[i] for i in perm[b : b + size]]
        mean = torch.stack([_flat(updates[p]) for p in group]).mean(0)
        out[f"bucket{b // size:02d}"] = _unflat(mean, updates[group[0]])
    return out


def run(s: Setting, rounds: int, config: AggregatorConfig, beta: float) -> float:
    xtr, ytr, xte, yte = load_data(s.seed)
    shards = make_shards(ytr, s.shards, s.seed)
    attackers = list(range(N_PEERS - s.f, N_PEERS))  # the last f peer ids
    xs = [xtr[i] for i in shards]
    ys = [ytr[i] for i in shards]
    if s.attack in ATTACKS_DATA_LEVEL:
        for a in attackers:
            ys[a] = flip_labels(ys[a], CLASSES)
    glob = init_params(s.seed)
    spec = {k: TensorSpec.of(v) for k, v in glob.items()}
    ids = [f"peer{i:02d}" for i in range(N_PEERS)]
    weights = {ids[i]: float(len(shards[i])) for i in range(N_PEERS)}
    absent = s.attack == "absent"  # the f peers simply do not take part: the honest-only ceiling
    attacks = {a: new_attack(s.attack) for a in attackers} if s.f and not absent else {}
    g = torch.Generator().manual_seed(5000 + s.seed)
    rng = torch.Generator().manual_seed(6000 + s.seed)
    momenta: list[dict[str, torch.Tensor] | None] = [None] * N_PEERS
    prev = None
    for rnd in range(rounds):
        deltas = local_deltas(glob, xs, ys, g)
        if beta > 0:
            momenta = [worker_momentum(m, d, beta) for m, d in zip(momenta, deltas, strict=True)]
            sent = list(momenta)
        else:
            sent = list(deltas)
        honest = [sent[i] for i in range(N_PEERS) if i not in attackers]
        for a in attackers if not absent else []:
            sent[a] = attacks[a](honest, sent[a], rng, N_PEERS, s.f)
        present = [i for i in range(N_PEERS) if not (absent and i in attackers)]
        received = {ids[i]: sent[i] for i in present}
        use = {p: weights[p] for p in received} if s.aggregator in WEIGHTED else None
        if s.pre == "nnm":
            received = nnm(received)
        elif s.pre.startswith("bucket"):
            received, use = bucket(received, int(s.pre.removeprefix("bucket")), rnd), None
        try:
            res = aggregate(received, expected=spec, config=config, weights=use, previous=prev)
        except NotEnoughUpdatesError:  # the model diverged: honest updates are NaN too
            break
        prev = res.tensors
        glob = {k: glob[k] + res.tensors[k] for k in glob}
    return accuracy(glob, xte, yte)


def _or_default(value: object) -> object:
    return "default" if value is None else value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="f=4 only, one seed, 20 rounds")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--momentum", type=float, default=0.0, help="worker momentum beta (0 = off)")
    ap.add_argument("--tau-scale", type=float, default=None, help="CenteredClip tau_scale")
    ap.add_argument("--reject-score", type=float, default=None, help="CenteredClip reject_score")
    ap.add_argument("--start", default=None, help="CenteredClip start: median | previous")
    ap.add_argument(
        "--pre", default="none", help="bench-only transform before aggregation: nnm | bucketS"
    )
    ap.add_argument("--aggregators", default=",".join(AGGREGATORS))
    ap.add_argument("--attacks", default=",".join(["absent", *sorted(ATTACKS)]))
    ap.add_argument("--shards", default="iid,noniid")
    ap.add_argument("--f", default="2,4", help="attacker counts (comma-separated)")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)

    seeds = list(range(1 if args.quick else args.seeds))
    rounds = 20 if args.quick else args.rounds
    fs = [4] if args.quick else [int(x) for x in args.f.split(",")]
    aggs = args.aggregators.split(",")
    attacks = args.attacks.split(",")
    shard_kinds = args.shards.split(",")

    def cfg(row: str) -> AggregatorConfig:
        name = rule_name(row)
        params: dict[str, float | str] = {}
        if name == "centered_clip" and args.tau_scale is not None:
            params["tau_scale"] = args.tau_scale
        if name == "centered_clip" and args.reject_score is not None:
            params["reject_score"] = args.reject_score
        if name == "centered_clip" and args.start is not None:
            params["start"] = args.start
        return AggregatorConfig(name, params)

    t0 = time.perf_counter()
    table: dict[tuple[str, str, int, str], float] = {}
    for shards in shard_kinds:
        for agg in aggs:
            rows = [("none", 0)] + [(a, f) for f in fs for a in attacks]
            for attack, f in rows:
                accs = [
                    run(
                        Setting(agg, attack, f, shards, sd, args.pre),
                        rounds,
                        cfg(agg),
                        args.momentum,
                    )
                    for sd in seeds
                ]
                table[(shards, agg, f, attack)] = statistics.fmean(accs)
        print(f"# {shards} done after {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    print(
        f"# final test accuracy %, n={N_PEERS}, rounds={rounds}, seeds={len(seeds)}, "
        f"momentum={args.momentum}, tau_scale={_or_default(args.tau_scale)}, "
        f"reject_score={_or_default(args.reject_score)}, start={_or_default(args.start)}, "
        f"pre={args.pre}"
    )
    for shards in shard_kinds:
        for f in fs:
            print(f"\n## {shards}, f={f} (no-attack column: f=0)\n")
            print("| aggregator | no attack | " + " | ".join(attacks) + " | worst gap |")
            real = [a for a in attacks if a != "absent"]  # "absent" is a ceiling, not an attack
            print("|---" * (len(attacks) + 3) + "|")
            for agg in aggs:
                base = table[(shards, agg, 0, "none")]
                vals = [table[(shards, agg, f, a)] for a in attacks]
                gap = base - min(table[(shards, agg, f, a)] for a in real)
                cells = " | ".join(f"{v:.1f}" for v in vals)
                mark = "**" if agg == DEFAULT else ""
                print(f"| {mark}{agg}{mark} | {base:.1f} | {cells} | {gap:.1f} |")
    print()
    ok = True
    for shards in shard_kinds:
        if DEFAULT not in aggs:
            break
        base = table[(shards, DEFAULT, 0, "none")]
        real = [a for a in attacks if a != "absent"]
        worst = min(real, key=lambda a: table[(shards, DEFAULT, max(fs), a)])
        gap = base - table[(shards, DEFAULT, max(fs), worst)]
        ok &= gap <= 5.0
        ceiling = table.get((shards, DEFAULT, max(fs), "absent"))
        print(
            f"{DEFAULT} {shards} f={max(fs)}: no-attack {base:.1f}, worst {worst} "
            f"{table[(shards, DEFAULT, max(fs), worst)]:.1f}, gap {gap:.1f} points (goal <= 5)"
            + ("" if ceiling is None else f"; honest-only (absent) {ceiling:.1f}")
        )
        mean_base = table[(shards, "mean", 0, "none")] if "mean" in aggs else None
        if mean_base is not None:
            worst_m = min(real, key=lambda a: table[(shards, "mean", max(fs), a)])
            print(
                f"  baseline mean {shards} f={max(fs)}: no-attack {mean_base:.1f}, worst {worst_m} "
                f"{table[(shards, 'mean', max(fs), worst_m)]:.1f}"
            )
    print(f"goal met: {ok}; wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
