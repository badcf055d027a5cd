"""Data-level attacks for ``cnode train --attack`` (a TESTING AID ONLY, issue 12).

The node trains on corrupted text and sends the update that gives, honestly signed and shaped:
only scoring on the sender's assigned data (scores/_scoring.py) can tell. Both corruptions are
deterministic and keep the shard assignment: the node still claims, and is scored on, its shard.
"""

from __future__ import annotations

import dataclasses

import torch

from ._data import TextData
from ._stream import StreamedSequences

__all__ = ["DATA_ATTACKS", "corrupt_data"]

# "flipped_tokens": every token id t becomes vocab_size - 1 - t, the text model's analogue of
# flip_labels (a consistently relabelled language). "shuffled_tokens": each training sequence's
# tokens in a fixed random order (unigram statistics kept, order lost).
DATA_ATTACKS = ("flipped_tokens", "shuffled_tokens")


def corrupt_data(data: TextData, kind: str, vocab_size: int) -> TextData:
    """``data`` with its training sequences corrupted by ``kind`` (one of DATA_ATTACKS).

    A dataset of many files (sequences read on demand) is corrupted as each batch is read:
    flipped alike; shuffled with one fixed order of positions for every sequence."""
    if kind not in DATA_ATTACKS:
        raise ValueError(f"unknown data attack {kind!r} (known: {', '.join(DATA_ATTACKS)})")
    if isinstance(data.train, StreamedSequences):
        order = torch.randperm(data.train.seq_len, generator=torch.Generator().manual_seed(0))

        def corrupt(batch: torch.Tensor) -> torch.Tensor:
            return (vocab_size - 1) - batch if kind == "flipped_tokens" else batch[..., order]

        return dataclasses.replace(data, train=data.train.with_transform(corrupt))
    if kind == "flipped_tokens":
        if int(data.train.max()) >= vocab_size:
            raise ValueError(f"token ids reach {int(data.train.max())}, vocab_size {vocab_size}")
        train = (vocab_size - 1) - data.train
    else:
        g = torch.Generator().manual_seed(0)
        order = torch.rand(data.train.shape, generator=g).argsort(dim=1)
        train = data.train.gather(1, order)
    return dataclasses.replace(data, train=train.contiguous())
