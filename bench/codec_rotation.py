"""Held-out loss of a shared rotating schedule (every peer sends the same chunks a round), by probe.

The question (issue 25): can ``training.update_codec`` reach 0.01x f32's bytes and stay within
2 % of f32's held-out loss after 8 rounds if all honest peers send the SAME coordinates in a
round, chosen by a rotation everyone knows, so that no offsets are sent and the mean is not
diluted by the zeros of peers who chose other coordinates (what holds sparse-topk back)?

This bench answers it before any wire format is built. It runs the round of bench/codec_loss.py
(four NodeTrainers with fixed identities, hence fixed shards, the demo's model, the run's rule,
``aggregate_round``) but takes each update through a simulated codec in memory:

* ``chunk`` mask: the flat update is cut into the run's segments and each segment into chunks
  of ``SPARSE_CHUNK`` values; chunk ``j`` of segment ``i`` is sent in round ``r`` iff
  ``(g + r) mod P == 0`` with ``g`` the chunk's index counted over all segments; ``stride``
  mask: value ``v`` of the flat update is sent iff ``(v + r) mod P == 0``; ``topk``: not a
  rotation but the real ``sparse-topk:K`` codec with ``K = 4096 / P`` (its bytes as encoded), to
  try ``carry`` on it.
* each sent value at ``B`` bits with one float32 scale per 4096 sent values: B = 1 is
  ``sign x mean|v|``; B = 2 is ``sign x {0.5674, 1.8930} x mean|v|`` split at ``1.2302 x
  mean|v|`` (Lloyd-Max levels of a Gaussian, in units of its mean magnitude); B >= 3 is
  ``round(v / s)`` in ``[-(2^(B-1) - 1), 2^(B-1) - 1]``, ``s = absmax / (2^(B-1) - 1)``.
* error feedback: what is not sent (unscheduled values and the quantization error) is the
  residual, added with ``error_decay`` x it to the next round's update, as a node does.
* ``carry``: the next round's local training starts from ``state + error_decay x residual``
  instead of ``state``: a peer continues its own unsent progress (Streaming DiLoCo's fragments,
  Douillard et al. 2025), where without it every round re-learns what was not sent yet and the
  residual sums the same step P times.

Bytes are counted, not sent: per segment a uint16 count of chunks, per sent chunk a uint16
index, its scales and ``ceil(values x B / 8)`` bytes (the ``stride`` mask needs no index). The
ratio is to ``4 x numel`` (f32's payload; the ~5 KB manifest of an update, 0.0073x on this
171k-parameter model and 0.0001x on the 10.2M one, is left out of both). The f32 row is the same
loop with the update sent as it is, measured in the same run: its losses match
bench/codec_loss.py's f32 run.

    .venv/bin/python bench/codec_rotation.py --rounds 8 --setting 7:2:chunk:1:carry 4:1:stride:1
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
from pathlib import Path

import structlog
import torch

from cnode.aggregation import (
    decode_update_tensor,
    encode_update_tensor,
    flat_segments,
    unflatten_segments,
)
from cnode.auth import Identity
from cnode.node.train import NodeTrainer, TrainingConfig, aggregate_round
from cnode.node.train.model import Residual, State, evaluate, train_local, with_residual
from cnode.storage import BlockStore

PEERS = 4
CHUNK = 4096
SCALE_EVERY = 4096  # sent values per float32 scale
# B = 2: levels and split in units of the block's mean magnitude (Gaussian Lloyd-Max).
LOW, HIGH, SPLIT = 0.5674, 1.8930, 1.2302


class Setting:
    """``P:B:MASK:BETA[:carry]``, or ``f32``."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        if spec == "f32":
            self.period, self.bits, self.mask, self.decay, self.carry = 1, 32, "all", 1.0, False
            return
        fields = spec.split(":")
        if len(fields) not in (4, 5) or fields[2] not in ("chunk", "stride", "topk"):
            raise SystemExit(f"--setting {spec!r}: expected P:B:chunk|stride|topk:BETA[:carry]")
        self.period, self.bits = int(fields[0]), int(fields[1])
        self.mask, self.decay = fields[2], float(fields[3])
        self.carry = len(fields) == 5 and fields[4] == "carry"


def _quantize(values: torch.Tensor, bits: int) -> torch.Tensor:
    """``values`` through B bits with a scale per SCALE_EVERY values (float64 arithmetic)."""
    n = values.numel()
    blocks = math.ceil(n / SCALE_EVERY)
    x = torch.zeros(blocks * SCALE_EVERY, dtype=torch.float64)
    x[:n] = values
    x = x.view(blocks, SCALE_EVERY)
    counts = torch.tensor([min(SCALE_EVERY, n - b * SCALE_EVERY) for b in range(blocks)])
    if bits <= 2:
        mean = (x.abs().sum(1) / counts).unsqueeze(1)
        mag = mean if bits == 1 else torch.where(x.abs() >= SPLIT * mean, HIGH * mean, LOW * mean)
        q = torch.where(x == 0, torch.zeros_like(x), torch.sign(x) * mag)
    else:
        top = (1 << (bits - 1)) - 1
        s = x.abs().amax(1, keepdim=True) / top
        q = torch.round(x / torch.where(s > 0, s, torch.ones_like(s))).clamp(-top, top) * s
    return q.reshape(-1)[:n].to(torch.float32)


def _send(delta: State, setting: Setting, round_: int) -> tuple[State, int]:
    """What receivers would decode of ``delta`` this round, and its payload bytes."""
    segments = flat_segments(delta)
    decoded, nbytes, chunk, at = [], 0, 0, 0
    for seg in segments:
        out = torch.zeros_like(seg)
        nbytes += 2
        if setting.mask == "topk":  # the real codec, K = 4096 / P per chunk (B is its 2)
            encoded = encode_update_tensor(seg, f"sparse-topk:{CHUNK // setting.period}")
            out = decode_update_tensor(encoded, f"sparse-topk:{CHUNK // setting.period}", seg.shape)
            nbytes += encoded.numel() - 2
        elif setting.mask == "chunk":
            for j in range(math.ceil(seg.numel() / CHUNK)):
                if (chunk + round_) % setting.period == 0:
                    part = seg[j * CHUNK : (j + 1) * CHUNK]
                    out[j * CHUNK : (j + 1) * CHUNK] = _quantize(part, setting.bits)
                    nbytes += 2 + 4 * math.ceil(part.numel() / SCALE_EVERY)
                    nbytes += math.ceil(part.numel() * setting.bits / 8)
                chunk += 1
        else:
            sent = (torch.arange(at, at + seg.numel()) + round_) % setting.period == 0
            if bool(sent.any()):
                k = int(sent.sum())
                out[sent] = _quantize(seg[sent], setting.bits)
                nbytes += 4 * math.ceil(k / SCALE_EVERY) + math.ceil(k * setting.bits / 8)
        at += seg.numel()
        decoded.append(out)
    return unflatten_segments(decoded, {n: tuple(t.shape) for n, t in delta.items()}), nbytes


def _run(
    setting: Setting, rounds: int, work: Path, keys: dict[str, object]
) -> tuple[list[float], float]:
    """Held-out loss per round and the payload bytes sent as a share of f32's."""
    config = TrainingConfig.from_dict({"update_codec": "f32", **keys})
    nodes = [
        NodeTrainer(
            config,
            run="bench",
            identity=Identity.from_seed(bytes([i + 1]) * 32),
            store=BlockStore(work / setting.spec.replace(":", "_") / f"n{i}"),
        )
        for i in range(PEERS)
    ]
    state = nodes[0].state
    residual: dict[str, Residual] = {}
    losses, sent_bytes, f32_bytes = [], 0, 0
    for round_ in range(1, rounds + 1):
        updates = {}
        for node in nodes:
            kept = residual.get(node.peer)
            start = with_residual(state, kept, setting.decay) if kept and setting.carry else state
            local = train_local(node.model, start, node.train_data, config, peer_id=node.peer,
                                round_=round_, placement=node.placement)  # fmt: skip
            delta = with_residual(local.delta, kept, setting.decay) if kept else local.delta
            numel = sum(t.numel() for t in delta.values())
            f32_bytes += 4 * numel
            if setting.spec == "f32":
                updates[node.peer], nbytes = delta, 4 * numel
            else:
                updates[node.peer], nbytes = _send(delta, setting, round_)
                left = {k: delta[k] - updates[node.peer][k] for k in delta}
                residual[node.peer] = Residual(round_, left)
            sent_bytes += nbytes
        state = aggregate_round(state, updates, config).state
        losses.append(evaluate(nodes[0].model, state, nodes[0].data))
    return losses, sent_bytes / f32_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--local-steps", type=int, default=16)
    parser.add_argument(
        "--outer-lr",
        type=float,
        default=1.0,
        help="sgd outer lr of the settings' runs (f32's stays 1)",
    )
    parser.add_argument(
        "--setting",
        nargs="+",
        required=True,
        help="P:B:chunk|stride|topk:BETA[:carry], e.g. 7:2:chunk:0.95:carry (f32 runs first)",
    )
    args = parser.parse_args()
    settings = [Setting("f32"), *(Setting(s) for s in args.setting)]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(1)
    base: list[float] = []
    with tempfile.TemporaryDirectory(prefix="cnode-codec-rotation-") as tmp:
        for setting in settings:
            began = time.perf_counter()
            lr = 1.0 if setting.spec == "f32" else args.outer_lr
            keys = {"local_steps": args.local_steps, "outer_lr": lr}
            losses, ratio = _run(setting, args.rounds, Path(tmp), keys)
            base = base or losses
            print(
                f"{setting.spec:>22}: loss per round {' '.join(f'{v:.4f}' for v in losses)}; "
                f"vs f32 after {args.rounds} rounds {(losses[-1] / base[-1] - 1) * 100:+.2f}%; "
                f"payload {ratio:.5f}x f32; {time.perf_counter() - began:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
