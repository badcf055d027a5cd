"""bench/robustness.py --codec: updates travel through an update codec, as in a node.

An honest peer sends ``decode(encode(delta + residual))`` and keeps what the codec left out as
its next residual (error feedback, node/train/model/_residual.py); an attacker's update is
encoded and decoded too, since only well-formed bytes reach the aggregator. Bytes that fail to
decode (a NaN attacker's NaN scale) are left as they were: ``aggregate`` rejects their NaN, as a
node rejects the bytes. Each tensor is encoded on its own (a node encodes segments of the flat
update; for this bench's 2410-value MLP the difference is where chunks start).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from cnode.aggregation import (
    UpdateEncodingError,
    decode_update_tensor,
    encode_update_tensor,
    wire_codec,
)

Update = Mapping[str, torch.Tensor]


def wire(codec: str) -> str:
    """The codec string for ``--codec`` (sparse-topk at the default density 1/64)."""
    return wire_codec(codec, 1 / 64)


def through_codec(
    update: Update, residual: Update | None, codec: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What receivers decode of ``update`` (+ ``residual``), and the new residual."""
    sent, left = {}, {}
    for name, t in update.items():
        x = t.float() + (residual[name] if residual is not None else 0.0)
        try:
            back = decode_update_tensor(encode_update_tensor(x.contiguous(), codec), codec, x.shape)
        except UpdateEncodingError:
            back = x
        sent[name] = back.to(t.dtype)
        left[name] = x - back
    return sent, left
