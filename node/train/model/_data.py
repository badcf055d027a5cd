"""Training text, its tokenizer, and the shard each peer trains on in each round.

The default corpus ships with the project (``data/corpus.txt``): docstrings of CPython 3.11's
standard library, extracted once and frozen into the file. Docstrings exist on every machine, but
they change between Python versions, and peers must cut the same sequences from the same bytes, so
the text is shipped rather than read from the running interpreter. The byte-level BPE tokenizer is
trained locally with ``tokenizers`` from that text (deterministic; ~0.2 s) and also shipped as
``data/tokenizer.json``; a test retrains it and checks it is the same.

A corpus may also be one file of a Hugging Face dataset repo pinned to a commit
(``hf://datasets/OWNER/NAME/PATH@COMMIT``), downloaded once into huggingface_hub's cache by
:func:`cnode.node.hub.download_file`: the Hub says the size before any byte is fetched, so a file
over ``MAX_CORPUS_BYTES`` is never downloaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.implementations import ByteLevelBPETokenizer

from .. import limits
from .._config import (
    BUILTIN_CORPUS,
    DataConfig,
    HubCorpus,
    ModelConfig,
    parse_hub_corpus,
    parse_pretrained,
)
from .._exceptions import TrainingConfigError
from ._files import DatasetFiles, is_dataset
from ._held import build_streamed, tokenizer_text
from ._stream import StreamedSequences

__all__ = [
    "TextData",
    "assigned_shard",
    "load_corpus_text",
    "load_tokenizer",
    "shard_of",
    "train_tokenizer",
]

DATA_DIR = Path(__file__).parent.parent / "data"  # node/train/data: shipped package data
CORPUS_FILE = DATA_DIR / "corpus.txt"
TOKENIZER_FILE = DATA_DIR / "tokenizer.json"
SPECIAL_TOKENS = ("<|endoftext|>",)
# The shipped tokenizer was trained with exactly this vocabulary size on the shipped corpus.
BUILTIN_VOCAB_SIZE = 1024


def load_corpus_text(corpus: str) -> str:
    """The training text named by ``corpus``: the shipped corpus, a local or a Hub UTF-8 file.

    Raises :class:`TrainingConfigError` (one line, naming ``corpus``) when the text cannot be
    had: a missing file, not UTF-8, over ``MAX_CORPUS_BYTES``, an unpinned Hub revision, a Hub
    that cannot be reached or answers an error (404: no such dataset, commit or file).
    """
    hub = parse_hub_corpus(corpus)
    if hub is not None:
        return _hub_corpus_text(corpus, hub)
    if corpus == BUILTIN_CORPUS:
        raw = CORPUS_FILE.read_text(encoding="utf-8")
        # The file opens with a few '# ' header lines (source, licence) that are not trained on.
        lines = raw.split("\n")
        while lines and lines[0].startswith("# "):
            lines.pop(0)
        return "\n".join(lines).lstrip("\n")
    path = Path(corpus).expanduser()
    try:
        size = path.stat().st_size
        if size > limits.MAX_CORPUS_BYTES:
            raise TrainingConfigError(
                f"corpus {path} is {size} bytes, over MAX_CORPUS_BYTES ({limits.MAX_CORPUS_BYTES})"
            )
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainingConfigError(f"cannot read corpus {path}: {exc}") from exc


def _hub_corpus_text(corpus: str, hub: HubCorpus) -> str:
    # Imported here: the Hub client (and cnode.auth's libp2p keys under it) is needed only for
    # an hf:// corpus, so the model and data load where the network stack is not installed
    # (bench/gpu_check.py on a bare GPU machine).
    from cnode.node.hub import HubError, download_file

    try:
        path = download_file(
            hub.repo,
            hub.path,
            repo_type="dataset",
            revision=hub.revision,
            max_bytes=limits.MAX_CORPUS_BYTES,
        )
        return path.read_bytes().decode("utf-8")
    except HubError as exc:  # its message carries the status, never the client's text or token
        raise TrainingConfigError(f"cannot load corpus {corpus}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TrainingConfigError(
            f"cannot load corpus {corpus}: not UTF-8 text (byte {exc.start})"
        ) from None
    except OSError as exc:  # the downloaded file vanished or cannot be read
        raise TrainingConfigError(
            f"cannot read corpus {corpus} from the Hub cache: {exc.strerror}"
        ) from None


def train_tokenizer(text: str | Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``text`` (one string, or strings in order); the same
    text gives the same tokenizer."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        iter([text]) if isinstance(text, str) else iter(text),
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    return Tokenizer.from_str(bpe.to_str())


def hub_tokenizer(name: str, key: str) -> Tokenizer:
    """``tokenizer.json`` of the Hub repo ``name`` ("OWNER/NAME@COMMIT", ``training.model.
    {key}``)."""
    repo, revision = parse_pretrained(name, key=key)
    try:
        return Tokenizer.from_pretrained(repo, revision=revision)
    except OSError as exc:  # huggingface_hub errors (not found, offline) are OSErrors
        raise TrainingConfigError(
            f"cannot load the tokenizer of {name!r} from the Hub: {exc}"
        ) from exc


def load_tokenizer(
    data: DataConfig, model: ModelConfig, text: str | Iterable[str] | None = None
) -> Tokenizer:
    """The run's tokenizer: ``training.model.tokenizer``'s, a Hub model's own, the shipped one,
    or one trained here.

    ``text`` is what a trained one learns from if the caller has it already (else the corpus
    is loaded when needed).
    """
    if model.tokenizer or model.pretrained:
        key = "tokenizer" if model.tokenizer else "pretrained"
        tokenizer = hub_tokenizer(model.tokenizer or model.pretrained, key)
        if model.tokenizer and tokenizer.get_vocab_size() > model.vocab_size:
            raise TrainingConfigError(
                f"training.model.tokenizer {model.tokenizer!r} has {tokenizer.get_vocab_size()} "
                f"tokens, more than the model's vocab_size ({model.vocab_size})"
            )
        return tokenizer
    if data.corpus == BUILTIN_CORPUS and model.vocab_size == BUILTIN_VOCAB_SIZE:
        return Tokenizer.from_file(str(TOKENIZER_FILE))
    if text is None:
        text = load_corpus_text(data.corpus)
    tokenizer = train_tokenizer(text, model.vocab_size)
    if tokenizer.get_vocab_size() > model.vocab_size:
        raise TrainingConfigError("tokenizer vocabulary is larger than model.vocab_size")
    return tokenizer


def shard_of(peer_id: str, n_shards: int) -> int:
    """The shard a peer trains on under ``assignment = "fixed"``: its id's SHA-256, modulo the
    number of shards."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big") % n_shards


def assigned_shard(
    peer_id: str, round_: int, *, n_shards: int, seed: int, assignment: str = "rotate"
) -> int:
    """The shard ``peer_id`` trains on in ``round_``, and on which its update is scored.

    A function of public values only (the run's seed and assignment, the peer id, the round), so
    trainer, scorers and replay agree without a message. ``"rotate"``: rounds are cut into
    epochs of ``n_shards``; in epoch ``e`` the peer visits every shard once, in the order
    ``(a * k + b) mod n_shards`` for the epoch's k-th round, with ``a`` (a unit mod n_shards)
    and ``b`` drawn from SHA-256 of (seed, peer id, e). So over any 2 n_shards − 1 rounds a
    node trains on all the data, and two peers that share a shard in one round seldom share it
    in the next (ids that hash alike no longer shrink the swarm's data, as under ``"fixed"``).
    """
    if assignment == "fixed":
        return shard_of(peer_id, n_shards)
    if assignment != "rotate":
        raise TrainingConfigError(f"training.data.assignment {assignment!r} is not known")
    if n_shards == 1:
        return 0
    epoch, k = divmod(round_, n_shards)
    digest = hashlib.sha256(f"shards/{seed}/{peer_id}/{epoch}".encode()).digest()
    a = int.from_bytes(digest[:8], "big") % n_shards
    while math.gcd(a, n_shards) != 1:  # the next unit: 1 is one, so this ends
        a = (a + 1) % n_shards
    b = int.from_bytes(digest[8:16], "big") % n_shards
    return (a * k + b) % n_shards


def _seed_of(*parts: object) -> int:
    text = "/".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class TextData:
    """The corpus cut into fixed sequences: the last ``eval_sequences`` are held out. For a
    dataset of many files the training sequences stay on disk (``_stream.StreamedSequences``,
    indexed by sequence id like the tensor) and the held-out ones are its ``held_out`` file's
    first, or its first file's first ``eval_sequences`` (``_held.py``)."""

    train: torch.Tensor | StreamedSequences  # int64 [n_train, seq_len], or read on demand
    eval: torch.Tensor  # int64 [eval_sequences, seq_len]
    n_shards: int
    tokenizer_json: str  # the tokenizer, as stored next to checkpoints
    assignment: str = "rotate"  # training.data.assignment (see assigned_shard)

    @classmethod
    def build(cls, data: DataConfig, model: ModelConfig) -> TextData:
        # The assignment does not change the sequences: one tokenization serves both.
        text = _build_cached(dataclasses.replace(data, assignment="rotate"), model)
        return dataclasses.replace(text, assignment=data.assignment)

    def prefetch(self, peer_id: str, round_: int, *, seed: int) -> None:
        """Start fetching what ``peer_id`` trains on in ``round_`` (a dataset of many files:
        download and tokenize its file in the background; a single text: nothing to do)."""
        if isinstance(self.train, StreamedSequences):
            shard = self.shard_index(peer_id, round_, seed=seed)
            self.train.prefetch(shard, peer_id, round_, seed)

    def shard_index(self, peer_id: str, round_: int, *, seed: int) -> int:
        """The shard ``peer_id`` trains on, and is scored on, in ``round_``."""
        return assigned_shard(
            peer_id, round_, n_shards=self.n_shards, seed=seed, assignment=self.assignment
        )

    def shard(self, peer_id: str, round_: int, *, seed: int) -> torch.Tensor:
        """Indices of the training sequences ``peer_id`` trains on in ``round_`` (its shard;
        for a dataset of many files, the one unit of its shard that the round reads)."""
        index = self.shard_index(peer_id, round_, seed=seed)
        if isinstance(self.train, StreamedSequences):
            return self.train.round_ids(index, peer_id, round_, seed)
        return self.shard_of_index(index)

    def shard_of_index(self, shard: int, *, seed: int = 0) -> torch.Tensor:
        """Indices of the training sequences in shard ``shard`` (every n_shards-th sequence;
        for a dataset of many files, every sequence of the shard's units under ``seed``)."""
        if isinstance(self.train, StreamedSequences):
            return self.train.shard_ids(shard, seed)
        return torch.arange(shard, self.train.shape[0], self.n_shards)

    def batches(
        self, peer_id: str, round_: int, *, seed: int, steps: int, batch_size: int
    ) -> list[torch.Tensor]:
        """The batches ``peer_id`` trains on in ``round_``: a function of its arguments only
        (and of the run's data: the corpus, n_shards, the assignment)."""
        indices = self.shard(peer_id, round_, seed=seed)
        generator = torch.Generator().manual_seed(_seed_of(seed, peer_id, round_))
        out = []
        for _ in range(steps):
            pick = torch.randint(0, indices.shape[0], (batch_size,), generator=generator)
            out.append(self.train[indices[pick]])
        return out


@lru_cache(maxsize=4)
def _build_cached(data: DataConfig, model: ModelConfig) -> TextData:
    if is_dataset(data.corpus):
        files = DatasetFiles.open(data)
        tokenizer = load_tokenizer(data, model, tokenizer_text(files, data.text_column))
        streamed, held = build_streamed(data, files, tokenizer)
        return TextData(streamed, held, data.n_shards, streamed.tokenizer.to_str())
    text = load_corpus_text(data.corpus)  # once: a Hub corpus is not asked for twice
    tokenizer = load_tokenizer(data, model, text)
    ids = tokenizer.encode(text).ids
    n = len(ids) // data.seq_len
    if n < data.eval_sequences + data.n_shards:
        raise TrainingConfigError(
            f"corpus gives {n} sequences of {data.seq_len} tokens; need more than "
            f"eval_sequences + n_shards ({data.eval_sequences + data.n_shards})"
        )
    seqs = torch.tensor(ids[: n * data.seq_len], dtype=torch.int64).view(n, data.seq_len)
    return TextData(
        train=seqs[: n - data.eval_sequences],
        eval=seqs[n - data.eval_sequences :],
        n_shards=data.n_shards,
        tokenizer_json=tokenizer.to_str(),
    )
