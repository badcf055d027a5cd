"""Scores, reputation, admission and reputation ban evidence (issue 12).

The last two tests are a real-torch simulation: 10 peers train a softmax-regression model on
scikit-learn's digits, each honest peer holding two classes, and the round runs exactly as the
node runs it (score every update on its sender's assigned data and a shared held-out batch, keep
the reputation, admit, CenteredClip on the admitted).
"""

from __future__ import annotations

import math
import random
import struct

import pytest
import torch
from sklearn.datasets import load_digits

from cnode.aggregation import (
    AggregationInputError,
    ReputationPolicy,
    TensorSpec,
    admission_bar,
    admit,
    aggregate,
    ban_bound,
    draw_indices,
    flip_labels,
    limits,
    loss_in_range,
    loss_score,
    record_loss,
    score_seed,
    score_update,
    scored_config,
    update_reputation,
)

UNITS = round(1 / limits.SCORE_UNIT)
SCORE_LOSS_FLOOR = limits.SCORE_LOSS_FLOOR
MAX_SCORE_LOSS = limits.MAX_SCORE_LOSS


def test_score_seed_depends_on_the_set_not_the_order() -> None:
    a = score_seed(["bafyb", "bafya", "bafyc"])
    assert a == score_seed(["bafyc", "bafyb", "bafya"])
    assert a != score_seed(["bafyb", "bafya"])
    assert len(a) == 32
    for bad in ([], [""], ["a\nb"]):
        with pytest.raises(AggregationInputError):
            score_seed(bad)


def test_draw_indices_is_deterministic_in_range_and_per_purpose() -> None:
    seed = score_seed(["bafyx"])
    own = draw_indices(seed, "own:peerA", 37, 64)
    assert own == draw_indices(seed, "own:peerA", 37, 64)
    assert all(0 <= i < 37 for i in own) and len(own) == 64
    assert own != draw_indices(seed, "own:peerB", 37, 64)
    assert len(set(draw_indices(seed, "held", 1000, 200))) > 150  # spread, not a constant
    with pytest.raises(AggregationInputError):
        draw_indices(seed, "held", 0, 4)
    with pytest.raises(AggregationInputError):
        draw_indices(seed, "held", 10, limits.MAX_SCORE_BATCH + 1)
    with pytest.raises(AggregationInputError):
        draw_indices(b"short", "held", 10, 4)


def test_loss_score_is_a_clamped_relative_decrease_in_units() -> None:
    assert loss_score(2.0, 1.0) == UNITS // 2
    assert loss_score(2.0, 2.0) == 0
    assert loss_score(1.0, 1.5) == -UNITS // 2
    assert loss_score(1.0, 100.0) == -UNITS  # clamped
    assert loss_score(1.0, math.inf) == -UNITS
    assert loss_score(1.0, math.nan) == -UNITS


# Every numeric edge a loss can take on either side of the update (issue 24, issue 29 item 1).
EDGES = [
    0.0, -0.0, 5e-324, 2.2e-308, 1e-300, SCORE_LOSS_FLOOR / 2, SCORE_LOSS_FLOOR, 1e-2, 0.5, 1.0,
    2.302585, 5.0, 1e3, MAX_SCORE_LOSS, MAX_SCORE_LOSS * 1.0000001, 1e300, 1.7976931348623157e308,
    -1.0, -1e308, math.inf, -math.inf, math.nan,
]  # fmt: skip


def test_loss_score_is_total_on_every_edge() -> None:
    """No pair of floats raises: each gives an integer in [-UNITS, UNITS]."""
    for before in EDGES:
        for after in EDGES:
            s = loss_score(before, after)
            assert isinstance(s, int) and -UNITS <= s <= UNITS, (before, after, s)


def test_loss_score_is_total_on_random_floats() -> None:
    """Seeded random floats of every magnitude and sign, and random bit patterns."""
    rng = random.Random(24)
    values = [rng.choice((-1, 1)) * 10 ** rng.uniform(-320, 308) for _ in range(400)]
    values += [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(400)]
    for _ in range(4000):
        a, b = rng.choice(values), rng.choice(values)
        s = loss_score(a, b)
        assert isinstance(s, int) and -UNITS <= s <= UNITS, (a, b)
        sc = score_update("p", a, b, b, a)
        assert isinstance(sc.score, int) and -2 * UNITS <= sc.score <= UNITS


def test_loss_score_edges_say_what_the_rule_says() -> None:
    # The state has no usable loss on the batch: nothing to judge the update by.
    for before in (math.nan, math.inf, -math.inf, MAX_SCORE_LOSS * 2):
        assert loss_score(before, 1.0) == 0
        assert loss_score(before, math.nan) == 0
    # The update blew the model up.
    for after in (math.nan, math.inf, MAX_SCORE_LOSS * 2, 1e308):
        assert loss_score(1.0, after) == -UNITS
    # Below the floor: a zero, denormal or negative loss counts as the floor (no division by 0).
    for tiny in (0.0, -0.0, 5e-324, -1.0, -1e308, SCORE_LOSS_FLOOR / 2):
        assert loss_score(tiny, tiny) == 0
        assert loss_score(SCORE_LOSS_FLOOR, tiny) == 0
        assert loss_score(1.0, tiny) == round((1.0 - SCORE_LOSS_FLOOR) * UNITS)
        assert loss_score(tiny, 1.0) == -UNITS  # a perfect fit broken: the most harm
    # The reported case: [header, 5.0, -1e308, 5.0, 4.9] scores, it does not overflow.
    s = score_update("p", 5.0, -1e308, 5.0, 4.9)
    assert (s.own, s.held) == (round((5.0 - SCORE_LOSS_FLOOR) / 5.0 * UNITS), 200)


def test_record_loss_is_in_range_and_scores_the_same() -> None:
    for x in EDGES:
        y = record_loss(x)
        assert loss_in_range(y), x
        for other in (0.5, 5.0, math.inf):
            assert loss_score(y, other) == loss_score(x, other) or x == -math.inf, (x, other)
            assert loss_score(other, y) == loss_score(other, x), (other, x)
    assert not loss_in_range(-1e308) and not loss_in_range(-math.inf)
    assert not loss_in_range(MAX_SCORE_LOSS * 2) and loss_in_range(5e-324)


def test_round_score_charges_held_out_harm_only() -> None:
    s = score_update("p", 2.0, 1.0, 1.0, 1.2)
    assert (s.own, s.held, s.score) == (5000, -2000, 3000)
    s = score_update("p", 2.0, 1.0, 1.0, 0.5)
    assert (s.own, s.held, s.score) == (5000, 5000, 5000)
    assert s.to_dict()["own_before"] == 2.0
    assert score_update("p", 2.0, math.inf, 1.0, 1.0).to_dict()["own_after"] == "inf"


def test_reputation_is_an_integer_ema_started_at_zero() -> None:
    d = limits.REPUTATION_DIVISOR
    rep = update_reputation({}, {"a": 400, "b": -801})
    assert rep == {"a": 400 // d, "b": -801 // d}  # floor division: -801 // 2 == -401
    rep2 = update_reputation(rep, {"a": 0})
    assert rep2 == {"a": rep["a"] + (0 - rep["a"]) // d, "b": rep["b"]}  # b unscored: unchanged
    assert all(isinstance(v, int) for v in rep.values())


def test_admission_needs_a_typical_score_and_a_reputation() -> None:
    scores = {"a": 1000, "b": 900, "c": 800, "d": 800 // limits.ADMIT_MEDIAN_DIVISOR - 1, "e": -5}
    assert admission_bar(scores) == 800 // limits.ADMIT_MEDIAN_DIVISOR
    rep = {"a": 1000, "b": -1, "c": 800, "d": 100, "e": 50}
    assert admit(scores, rep) == ["a", "c"]
    # A peer never scored before starts at reputation 0: admitted on its score alone.
    assert admit({"new": 1000, "a": 1000, "b": 1000}, rep) == ["a", "new"]
    # All noise (median <= 0): the floor decides, the reputation gates.
    assert admission_bar({"a": -3, "b": -2, "c": 5}) == limits.ADMIT_SCORE
    assert admission_bar({}) == limits.ADMIT_SCORE


def test_ban_bound_is_far_below_the_typical_reputation_and_at_most_ban_reputation() -> None:
    k = limits.BAN_MADS
    # median 300 (lower), MAD 20: attackers far below do not move either.
    rep = {"a": 280, "b": 300, "c": 320, "d": 340, "x": -5000, "y": -4000}
    values = sorted(rep.values())
    median = values[2]
    mad = sorted(abs(v - median) for v in values)[2]
    assert ban_bound(rep) == min(limits.BAN_REPUTATION, median - k * mad)
    assert ban_bound({"a": 1, "b": 2, "c": 3}) == limits.BAN_REPUTATION
    assert ban_bound({}) == limits.BAN_REPUTATION


def test_reputation_policy_recommends_after_consecutive_low_rounds_with_evidence() -> None:
    policy = ReputationPolicy()
    seed = score_seed(["bafy1"])
    bad = score_update("bad", 1.0, 1.5, 1.0, 1.5)
    good = [score_update(f"good{i}", 1.0, 0.9 - 0.01 * i, 1.0, 1.0) for i in range(3)]
    scores = {"bad": bad, **{g.peer: g for g in good}}  # f = 1 < n/2
    rep: dict[str, int] = {}
    out = []
    for rnd in range(1, limits.REPUTATION_BAN_ROUNDS + 2):
        rep = update_reputation(rep, {p: s.score for p, s in scores.items()})
        cids = {p: f"bafk-{p}-{rnd}" for p in scores}
        out.append(policy.observe(rnd, seed, scores, rep, cids))
    assert [len(o) for o in out] == [0] * (limits.REPUTATION_BAN_ROUNDS - 1) + [1, 0]
    rec = out[limits.REPUTATION_BAN_ROUNDS - 1][0]
    assert rec.peer == "bad" and rec.round == limits.REPUTATION_BAN_ROUNDS
    fig = rec.to_payload()["figures"]
    assert fig["update_cids"] == [
        f"bafk-bad-{r}" for r in range(1, limits.REPUTATION_BAN_ROUNDS + 1)
    ]
    assert fig["seeds"] == [seed.hex()] * limits.REPUTATION_BAN_ROUNDS
    assert fig["scores"][0]["own_after"] == 1.5
    assert all(b <= limits.BAN_REPUTATION for b in fig["bounds"])
    assert all(r < b for r, b in zip(fig["reputations"], fig["bounds"], strict=True))
    with pytest.raises(AggregationInputError):
        policy.observe(1, seed, {}, rep)


# -- real-torch simulation ------------------------------------------------------------------------

N, CLASSES, STEPS, LR, BATCH = 10, 10, 5, 0.5, 32


def _data():
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(7))
    x, y = x[perm], y[perm]
    shards = []
    for p in range(N):  # two classes per peer: p and p + 5 (mod 10), split between holders
        keep = ((y == p % 10) | (y == (p + 5) % 10)).nonzero().flatten()
        shards.append(keep[(p // 5) :: 2][:120])
    return x, y, shards, (x[1500:1650], y[1500:1650])


def _loss(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    logits = x.double() @ w.double() + b.double()
    return float(torch.nn.functional.cross_entropy(logits, y))


def _simulate(rounds: int, corrupt: dict[int, str]):
    x, y, shards, (hx, hy) = _data()
    g = torch.Generator().manual_seed(11)
    params = {"b": torch.zeros(CLASSES), "w": torch.zeros(64, CLASSES)}
    spec = {k: TensorSpec.of(v) for k, v in params.items()}
    ids = [f"peer{i:02d}" for i in range(N)]
    rep: dict[str, int] = {}
    policy = ReputationPolicy()
    admitted_rounds = dict.fromkeys(ids, 0)
    bans: dict[str, int] = {}
    for rnd in range(1, rounds + 1):
        updates = {}
        for i, p in enumerate(ids):
            w, b = params["w"].clone().requires_grad_(), params["b"].clone().requires_grad_()
            xs, ys = x[shards[i]], y[shards[i]]
            if corrupt.get(i) == "label_flip":
                ys = flip_labels(ys, CLASSES)
            elif corrupt.get(i) == "random":  # labels drawn uniformly over all classes
                ys = torch.randint(CLASSES, ys.shape, generator=g)
            for _ in range(STEPS):
                j = torch.randint(len(ys), (BATCH,), generator=g)
                loss = torch.nn.functional.cross_entropy(xs[j] @ w + b, ys[j])
                gw, gb = torch.autograd.grad(loss, [w, b])
                w, b = (
                    (w - LR * gw).detach().requires_grad_(),
                    (b - LR * gb).detach().requires_grad_(),
                )
            updates[p] = {"b": (b - params["b"]).detach(), "w": (w - params["w"]).detach()}
        seed = score_seed([f"bafy{p}{rnd}" for p in ids])
        scores = {}
        for i, p in enumerate(ids):
            oi = torch.tensor(draw_indices(seed, f"own:{p}", len(shards[i]), 64))
            hi = torch.tensor(draw_indices(seed, "held", len(hy), 64))
            ox, oy = x[shards[i]][oi], y[shards[i]][oi]  # the assigned data, true labels
            moved = {k: params[k] + limits.SCORE_STEP * updates[p][k] for k in params}
            scores[p] = score_update(
                p,
                _loss(params["w"], params["b"], ox, oy),
                _loss(moved["w"], moved["b"], ox, oy),
                _loss(params["w"], params["b"], hx[hi], hy[hi]),
                _loss(moved["w"], moved["b"], hx[hi], hy[hi]),
            )
        rep = update_reputation(rep, {p: s.score for p, s in scores.items()})
        keep = admit({p: s.score for p, s in scores.items()}, rep)
        for rec in policy.observe(rnd, seed, scores, rep, {p: f"bafk{p}{rnd}" for p in ids}):
            bans[rec.peer] = rnd
        res = aggregate({p: updates[p] for p in keep}, expected=spec, config=scored_config())
        for p in keep:
            assert res.records[p].clip_weight is not None and res.records[p].clip_weight > 0
            admitted_rounds[p] += 1
        params = {k: params[k] + res.tensors[k] for k in params}
    return admitted_rounds, bans, rep


def test_honest_heterogeneous_peers_keep_weight_and_are_never_banned_over_30_rounds() -> None:
    admitted, bans, rep = _simulate(30, {})
    assert bans == {}
    assert min(rep.values()) > limits.BAN_REPUTATION
    # Every honest peer is in the aggregate, with non-zero clip weight, in most rounds.
    assert min(admitted.values()) >= 27, admitted


def test_label_flipping_attackers_are_banned_within_3_rounds() -> None:
    attackers = {6: "label_flip", 8: "label_flip"}
    admitted, bans, _ = _simulate(6, attackers)
    assert bans == {"peer06": 3, "peer08": 3}
    assert admitted["peer06"] == admitted["peer08"] == 0
    assert min(admitted[f"peer{i:02d}"] for i in range(N) if i not in attackers) >= 5


def test_random_label_attackers_are_left_out_but_not_banned() -> None:
    # Their updates barely move their own data's loss: below the admission bar almost always, but
    # not evidence of harm (reputation stays >= BAN_REPUTATION), so no ban.
    attackers = {6: "random", 8: "random"}
    admitted, bans, _ = _simulate(6, attackers)
    assert admitted["peer06"] + admitted["peer08"] <= 1  # of 12 chances
    assert bans == {}
    assert min(admitted[f"peer{i:02d}"] for i in range(N) if i not in attackers) >= 5
