"""The digits task of bench/robustness.py: data, shards, a small MLP and local SGD steps.

Every peer's steps run batched (one tensor per parameter, a leading peer axis), so a 200-round
run of 10 peers stays within minutes on 2 cores.
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits

N_PEERS = 10
HIDDEN = 32
LOCAL_STEPS = 5
BATCH = 32
LR = 0.3
CLASSES = 10
DIRICHLET_ALPHA = 0.5
HELD = 150  # shared held-out images (scoring only); the test set is what remains (247)


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
    alpha = float(kind.removeprefix("dirichlet") or DIRICHLET_ALPHA)  # "dirichlet0.3": alpha 0.3
    conc = torch.full((N_PEERS,), alpha)
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
