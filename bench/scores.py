"""What scoring costs per round (issue 12): RoundScoring.score of n updates of the demo model.

Builds the run's default model (the demo's: ~170 k parameters), n random updates of its shape
and n distinct peer ids, and times ``RoundScoring.score`` (3n + 1 forward passes of
SCORE_SEQUENCES sequences in float64) after a warm-up round, best and median of --repeat.

    nice -n 5 .venv/bin/python bench/scores.py --n 16 --threads 1
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import structlog
import torch

from cnode.auth import Identity
from cnode.node.train import RoundScoring, TextData, TrainingConfig, build_model, model_state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(args.threads)
    config = TrainingConfig.from_dict({"scores": True, "partitioned": "never"})
    data = TextData.build(config.data, config.model)
    state = model_state(build_model(config))
    g = torch.Generator().manual_seed(0)
    peers = [Identity.generate().peer_id_str for _ in range(args.n)]
    updates = {
        p: {k: torch.randn(t.shape, generator=g) * 1e-3 for k, t in state.items()} for p in peers
    }
    headers = {p: f"bafy-header-{i}" for i, p in enumerate(peers)}
    scoring = RoundScoring(config, data)
    scoring.score(1, state, updates, headers)  # warm-up: builds the float64 model
    times = []
    for r in range(args.repeat):
        began = time.perf_counter()
        scoring.score(r + 2, state, updates, headers)
        times.append(time.perf_counter() - began)
    params = sum(t.numel() for t in state.values())
    print(
        f"n={args.n} threads={args.threads} params={params} forward passes={3 * args.n + 1}: "
        f"best {min(times):.2f} s, median {statistics.median(times):.2f} s per round"
    )


if __name__ == "__main__":
    main()
