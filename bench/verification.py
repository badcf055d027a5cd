"""How likely a lying partition aggregator is caught in the round it lies (issue 10).

In a partitioned round every member recomputes ``V = training.verify_partitions`` partitions
other than its own, chosen by ``cnode.aggregation.verification_choice`` from a seed nobody knows
until every result is out (sha256 of the recorded result CIDs). A wrong result is caught when at
least one honest member recomputes it. With n members, f of them Byzantine (the liar among them,
none of them reporting), each of the h = n - f honest members picks the liar's partition with
probability V / (n - 1), so

    P(caught in the round) = 1 - (1 - V / (n - 1)) ** (n - f)

This bench draws the real choice function over many random seeds and peer ids and prints the
measured rate beside the formula (the baseline), for n in {4, 8, 16}, V in {1, 2}, f in {1, n/4}.

    .venv/bin/python bench/verification.py             # 4000 rounds per row
    .venv/bin/python bench/verification.py --rounds 20000
"""

from __future__ import annotations

import argparse
import os
import random

from cnode.aggregation import verification_choice


def measured(n: int, v: int, f: int, rounds: int, rng: random.Random) -> float:
    caught = 0
    for _ in range(rounds):
        peers = [f"12D3KooW{rng.getrandbits(128):032x}" for _ in range(n)]
        seed = rng.randbytes(32)
        liar_partition = 0  # partition p is aggregated by the p-th member; the liar is member 0
        honest = range(f, n)  # members 0..f-1 are Byzantine and report nothing
        if any(
            liar_partition in verification_choice(seed, peers[i], n, v, exclude=[i]) for i in honest
        ):
            caught += 1
    return caught / rounds


def formula(n: int, v: int, f: int) -> float:
    return 1 - (1 - min(v, n - 1) / (n - 1)) ** (n - f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4000)
    args = parser.parse_args()
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    print(f"bench/verification.py: {args.rounds} simulated rounds per row")
    print(f"{'n':>3} {'V':>2} {'f':>2}  {'measured':>9}  {'formula':>8}  ratio")
    for n in (4, 8, 16):
        for v in (1, 2):
            for f in sorted({1, n // 4}):
                got, want = measured(n, v, f, args.rounds, rng), formula(n, v, f)
                print(f"{n:>3} {v:>2} {f:>2}  {got:>9.3f}  {want:>8.3f}  {got / want:.3f}")


if __name__ == "__main__":
    main()
