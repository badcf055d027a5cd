"""The training sequences of a dataset of many files, tokenized file by file to disk, read on
demand (specs/training.md, "Data": datasets of many files).

* **Packing.** A file's rows are tokenized in order, each followed by the end-of-text token, into
  one stream of token ids; its sequences are the stream cut into ``seq_len`` tokens (the tail
  dropped). A file's sequences are thus a function of its bytes and the tokenizer alone.
* **Shards.** Each file is cut into ``m = ceil(n_shards / n_files)`` pieces (sequence ``j`` of a
  file is in piece ``j mod m``); the (file, piece) *units* are ordered by
  ``sha256("{fingerprint}/{seed}/{path}/{piece}")`` and dealt to the shards in turn (the unit at
  position ``p`` to shard ``p mod n_shards``), so every shard has at least one. The map is a
  pure function of the commit and file list (``DatasetFiles.fingerprint``) and the run's seed.
* **A round's sequences.** In round ``r`` a peer trains on one unit of its round's shard
  (``assigned_shard``): unit ``int(sha256("unit/{seed}/{peer}/{r}")[:8]) mod len(units)``. So a
  round needs the files of one unit: the node downloads and tokenizes it when the round needs
  it, and the next round's ahead of time (:meth:`StreamedSequences.prefetch`), never the whole
  dataset. Scorers read the units of the updates they score the same way.
* **Memory.** Tokens go to a file of little-endian uint32 on disk (written under a temporary
  name, renamed when whole, so a failure leaves nothing half-written and nothing stored lost);
  a batch reads its sequences from there. Memory holds one record batch of rows at a time.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import structlog
import torch
from tokenizers import Tokenizer

from .. import limits
from ._files import DataFile, DatasetError, DatasetFiles, read_texts

__all__ = ["StreamedSequences", "token_cache_dir"]

log = structlog.get_logger(__name__)

# The token files' format; a change of packing must change it, so old caches are not read.
_FORMAT = "cnode-tokens/v1"
_ID_BITS = 32  # a sequence id is file index << 32 | sequence index in the file


def token_cache_dir() -> Path:
    """Where tokenized files are kept: beside huggingface_hub's cache (``$HF_HOME``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).parent / "cnode-tokens"


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()


def token_stream(
    files: DatasetFiles, file: DataFile, tokenizer: Tokenizer, eot: int, column: str
) -> Iterator[np.ndarray]:
    """The packed token ids of ``file``, a record batch at a time."""
    path = files.local(file)
    separator = np.asarray([eot], dtype="<u4")
    for texts in read_texts(path, f"{files.corpus}: {file.path}", file.format, column):
        # A batch's rows are encoded TOKENIZE_BATCH_CHARS at a time: an Encoding holds far more
        # than its ids (tokens, offsets, masks), so a whole batch of long rows would not be
        # small, and memory would follow the rows' length.
        start = 0
        while start < len(texts):
            end, chars = start, 0
            while end < len(texts) and (end == start or chars < limits.TOKENIZE_BATCH_CHARS):
                chars += len(texts[end])
                end += 1
            encodings = tokenizer.encode_batch(texts[start:end], add_special_tokens=False)
            parts = []
            for enc in encodings:
                parts += [np.asarray(enc.ids, dtype="<u4"), separator]
            del encodings
            if parts:
                yield np.concatenate(parts)
            start = end


class StreamedSequences:
    """A dataset's training sequences, indexed by id (``file << 32 | sequence``): ``self[ids]``
    is an int64 ``[len(ids), seq_len]`` tensor read from the token files."""

    def __init__(
        self,
        files: DatasetFiles,
        tokenizer: Tokenizer,
        *,
        eot: int,
        seq_len: int,
        n_shards: int,
        column: str,
        skip_first: int,  # sequences of the first file held out (the default held-out slice)
        cache: Path | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.files, self.tokenizer, self.eot = files, tokenizer, eot
        self.seq_len, self.n_shards, self.column = seq_len, n_shards, column
        self.skip_first = skip_first
        self.cache = cache or token_cache_dir()
        self.transform = transform  # data attacks (corrupt_data): applied to every batch read
        self._tokenizer_id = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        self._lock = threading.Lock()
        self._file_locks: dict[int, threading.Lock] = {}
        self._lengths: dict[int, int] = {}  # file index -> tokens, once tokenized
        self._units: dict[int, list[list[tuple[int, int]]]] = {}  # seed -> units of each shard

    def with_transform(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> StreamedSequences:
        """The same sequences with ``fn`` applied to every batch read (shares the token files)."""
        other = StreamedSequences.__new__(StreamedSequences)
        other.__dict__.update(self.__dict__)
        other.transform = fn
        return other

    # -- the shard map -----------------------------------------------------------------------

    @property
    def pieces(self) -> int:
        return math.ceil(self.n_shards / len(self.files.files))

    def units(self, shard: int, seed: int) -> list[tuple[int, int]]:
        """The (file index, piece) units of ``shard`` under ``seed``, in dealing order."""
        with self._lock:
            dealt = self._units.get(seed)
            if dealt is None:
                fp, m = self.files.fingerprint, self.pieces
                order = sorted(
                    ((i, p) for i in range(len(self.files.files)) for p in range(m)),
                    key=lambda u: _digest(fp, seed, self.files.files[u[0]].path, u[1]),
                )
                dealt = [order[s :: self.n_shards] for s in range(self.n_shards)]
                self._units[seed] = dealt
        return dealt[shard]

    def round_unit(self, shard: int, peer: str, round_: int, seed: int) -> tuple[int, int]:
        units = self.units(shard, seed)
        pick = int.from_bytes(_digest("unit", seed, peer, round_)[:8], "big") % len(units)
        return units[pick]

    def unit_ids(self, unit: tuple[int, int]) -> torch.Tensor:
        """The ids of the sequences of ``unit`` (tokenizing its file first if needed)."""
        index, piece = unit
        n = self.ensure(index) // self.seq_len
        first = self.skip_first if index == 0 else 0
        start = first + (piece - first) % self.pieces
        seqs = torch.arange(start, n, self.pieces, dtype=torch.int64)
        if seqs.numel() == 0:
            name = self.files.files[index].path
            raise DatasetError(
                f"{self.files.corpus}: {name} gives {n} sequences of {self.seq_len} tokens, "
                f"none in its piece {piece} of {self.pieces}: too little text for n_shards "
                f"{self.n_shards}"
            )
        return (index << _ID_BITS) | seqs

    def round_ids(self, shard: int, peer: str, round_: int, seed: int) -> torch.Tensor:
        """The ids ``peer`` trains on (and is scored on) in ``round_``: one unit of ``shard``."""
        return self.unit_ids(self.round_unit(shard, peer, round_, seed))

    def shard_ids(self, shard: int, seed: int) -> torch.Tensor:
        """Every sequence of ``shard`` (all its units: all their files are read)."""
        return torch.cat([self.unit_ids(u) for u in self.units(shard, seed)])

    def prefetch(self, shard: int, peer: str, round_: int, seed: int) -> None:
        """Download and tokenize the file ``peer`` needs in ``round_``, in the background. An
        error is left for that round to meet (it reads the file again and raises it)."""
        index = self.round_unit(shard, peer, round_, seed)[0]
        if index in self._lengths:
            return

        def run() -> None:
            try:
                self.ensure(index)
            except DatasetError as exc:
                log.warning("dataset_prefetch_failed", round=round_, error=str(exc))

        threading.Thread(target=run, name=f"prefetch-{round_}", daemon=True).start()

    # -- token files -------------------------------------------------------------------------

    def _token_path(self, index: int) -> Path:
        f, files = self.files.files[index], self.files
        origin = files.commit or str((files.root or Path()).resolve())
        key = _digest(_FORMAT, origin, f.path, f.size, f.sha256, f.git_oid, self.column,
                      self.eot, self._tokenizer_id).hex()  # fmt: skip
        return self.cache / f"{key}.u32"

    def ensure(self, index: int) -> int:
        """The number of tokens of file ``index``, tokenizing it to disk first if needed."""
        with self._lock:
            if index in self._lengths:
                return self._lengths[index]
            file_lock = self._file_locks.setdefault(index, threading.Lock())
        with file_lock:  # one tokenization per file, whoever asks first
            if index not in self._lengths:
                path = self._token_path(index)
                if not path.exists():
                    self._tokenize(index, path)
                with self._lock:
                    self._lengths[index] = path.stat().st_size // 4
        return self._lengths[index]

    def _tokenize(self, index: int, path: Path) -> None:
        file = self.files.files[index]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with tmp.open("wb") as out:
                stream = token_stream(self.files, file, self.tokenizer, self.eot, self.column)
                for tokens in stream:
                    out.write(tokens.tobytes())
            os.replace(tmp, path)  # whole or not at all
        finally:
            tmp.unlink(missing_ok=True)
        log.info("dataset_file_tokenized", file=file.path, tokens=path.stat().st_size // 4)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).tolist()
        out = np.empty((len(flat), self.seq_len), dtype=np.int64)
        handles: dict[int, int] = {}
        try:
            for row, sid in enumerate(flat):
                index, seq = sid >> _ID_BITS, sid & ((1 << _ID_BITS) - 1)
                if index not in handles:
                    self.ensure(index)
                    handles[index] = os.open(self._token_path(index), os.O_RDONLY)
                size = self.seq_len * 4
                raw = os.pread(handles[index], size, seq * size)
                if len(raw) != size:
                    raise IndexError(f"sequence {seq} of file {index} is past its end")
                out[row] = np.frombuffer(raw, dtype="<u4")
        finally:
            for fd in handles.values():
                os.close(fd)
        batch = torch.from_numpy(out).view(*ids.shape, self.seq_len)
        return self.transform(batch) if self.transform is not None else batch
