"""What every node reads of a dataset of many files before its first round: the file list, the
tokenizer and the held-out sequences (specs/training.md, "Data").

* **Tokenizer.** ``training.model.tokenizer`` or a ``pretrained`` model's own, else a byte-level
  BPE trained (as for one text file) on the first ``TOKENIZER_TRAIN_CHARS`` characters of the
  dataset's first file, its rows in order: every node reads the same prefix and trains the same
  tokenizer.
* **End of text.** The tokenizer's ``<|endoftext|>`` (or ``</s>``, ``<|end_of_text|>``,
  ``<eos>``, the first it has): it follows every row when rows are packed.
* **Held-out set.** The first ``eval_sequences`` sequences of the ``held_out`` file, or, without
  one, of the first file (those are then not trained on). Only as many rows as they need are
  read.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from tokenizers import Tokenizer

from .. import limits
from .._config import DataConfig
from ._files import DatasetError, DatasetFiles, read_texts
from ._stream import StreamedSequences, token_stream

__all__ = ["build_streamed", "end_of_text", "tokenizer_text"]

END_OF_TEXT = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


def end_of_text(tokenizer: Tokenizer, name: str) -> int:
    """The id rows are separated by; DatasetError when the tokenizer has none of END_OF_TEXT."""
    for token in END_OF_TEXT:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    raise DatasetError(
        f"{name}: the tokenizer has no end-of-text token (none of {', '.join(END_OF_TEXT)})"
    )


def tokenizer_text(files: DatasetFiles, column: str) -> Iterator[str]:
    """The first TOKENIZER_TRAIN_CHARS characters of the first file's rows, in order."""
    first = files.files[0]
    left = limits.TOKENIZER_TRAIN_CHARS
    name = f"{files.corpus}: {first.path}"
    for texts in read_texts(files.local(first), name, first.format, column):
        for text in texts:
            yield text[:left]
            left -= min(left, len(text))
            if left == 0:
                return


def build_streamed(
    data: DataConfig, files: DatasetFiles, tokenizer: Tokenizer
) -> tuple[StreamedSequences, torch.Tensor]:
    """The training sequences (on disk, read on demand) and the held-out ones (in memory)."""
    eot = end_of_text(tokenizer, data.corpus)
    held_file = files.held_out or files.files[0]
    need = data.eval_sequences * data.seq_len
    got: list[np.ndarray] = []
    have = 0
    for tokens in token_stream(files, held_file, tokenizer, eot, data.text_column):
        got.append(tokens[: need - have])
        have += len(got[-1])
        if have == need:
            break
    if have < need:
        raise DatasetError(
            f"{data.corpus}: held-out file {held_file.path} gives {have // data.seq_len} "
            f"sequences of {data.seq_len} tokens; eval_sequences is {data.eval_sequences}"
        )
    held = torch.from_numpy(np.concatenate(got).astype(np.int64)).view(-1, data.seq_len)
    streamed = StreamedSequences(
        files,
        tokenizer,
        eot=eot,
        seq_len=data.seq_len,
        n_shards=data.n_shards,
        column=data.text_column,
        skip_first=0 if files.held_out else data.eval_sequences,
    )
    return streamed, held
