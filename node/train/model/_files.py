"""The files of a dataset of many Parquet or JSONL files, and their rows of text, streamed.

A dataset is every file of a Hub dataset repo at one commit (``hf://datasets/OWNER/NAME@COMMIT``)
or of a local folder that matches ``training.data.files`` (a glob; default every ``*.parquet``,
``*.jsonl`` and ``*.json``) and ``training.data.split``, in sorted path order. The Hub's listing
of the commit gives each file's size and hash; a downloaded file must have exactly those (else
the commit's file list and what was downloaded differ: an error naming the file).

Rows are read with pyarrow, a record batch at a time (``READ_BATCH_ROWS``), so a file of any
size is read in bounded memory. Every bad input is one :class:`DatasetError` (a
``TrainingConfigError``) naming the file and, where it applies, the row (0-based): a file that
is neither Parquet nor JSONL, a missing text column, a row that is not UTF-8, a Parquet file
whose footer points past its end, a JSONL line that is not JSON.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from .. import limits
from .._config import DataConfig, parse_hub_corpus
from .._exceptions import TrainingConfigError

__all__ = ["DataFile", "DatasetError", "DatasetFiles", "is_dataset", "read_texts"]

FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}
_DEFAULT_PATTERNS = tuple(f"*{ext}" for ext in FORMATS)


class DatasetError(TrainingConfigError):
    """A dataset that cannot be trained on: names the file and, where it applies, the row."""


def is_dataset(corpus: str) -> bool:
    """Whether ``corpus`` names a dataset of files (a Hub repo at a commit, a folder, or one
    Parquet or JSONL file) rather than one text file."""
    hub = parse_hub_corpus(corpus)
    if hub is not None:
        return hub.path == "" or Path(hub.path).suffix in FORMATS
    path = Path(corpus).expanduser()
    return path.is_dir() or path.suffix in FORMATS


@dataclass(frozen=True)
class DataFile:
    path: str  # in the repo, or relative to the folder
    size: int  # bytes, as the commit lists them (a folder: as found)
    sha256: str = ""  # an LFS file's hash, as the commit lists it
    git_oid: str = ""  # a small (non-LFS) file's git blob id, as the commit lists it

    @property
    def format(self) -> str:
        return FORMATS.get(Path(self.path).suffix, "")


def _selected(path: str, data: DataConfig) -> bool:
    """Whether a listed file is part of the dataset (files pattern, split)."""
    name = path.rsplit("/", 1)[-1]
    patterns = (data.files,) if data.files else _DEFAULT_PATTERNS
    if not any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in patterns):
        return False
    if data.split:
        parts = path.split("/")
        named = any(name.startswith(data.split + sep) for sep in "-_.")
        return data.split in parts[:-1] or named
    return True


@dataclass(frozen=True)
class DatasetFiles:
    """A dataset's files at one commit: the training files and the held-out one."""

    corpus: str
    commit: str  # the Hub commit; "" for a local folder
    files: tuple[DataFile, ...]  # the training files, sorted by path
    held_out: DataFile | None  # training.data.held_out, not trained on
    root: Path | None = None  # a local dataset's folder

    @classmethod
    def open(cls, data: DataConfig) -> DatasetFiles:
        """List the dataset ``data.corpus`` names; DatasetError for an empty one."""
        hub = parse_hub_corpus(data.corpus)
        if hub is not None:
            listed = _hub_listing(data.corpus, hub.repo, hub.revision)
            pattern = data.files or hub.path
            data = dataclasses.replace(data, files=pattern)
            commit, root = hub.revision, None
        else:
            root = Path(data.corpus).expanduser()
            listed, commit = _folder_listing(root), ""
            if root.is_file():
                root = root.parent
        return cls._select(data, listed, commit, root)

    @classmethod
    def _select(
        cls, data: DataConfig, listed: dict[str, DataFile], commit: str, root: Path | None
    ) -> DatasetFiles:
        where = f"training.data.corpus {data.corpus!r}"
        held = None
        if data.held_out:
            held = listed.get(data.held_out)
            if held is None:
                raise DatasetError(f"{where}: held_out file {data.held_out!r} is not in it")
        chosen = [f for p, f in sorted(listed.items()) if _selected(p, data) and f is not held]
        for f in [*chosen, *([held] if held else [])]:
            if not f.format:
                raise DatasetError(f"{where}: {f.path} is not a Parquet or JSONL file")
        if not chosen:
            said = f"files {data.files!r}" if data.files else "no files pattern"
            raise DatasetError(
                f"{where}: empty dataset: no Parquet or JSONL file matches ({said}, "
                f"split {data.split!r})"
            )
        if len(chosen) > limits.MAX_DATASET_FILES:
            raise DatasetError(
                f"{where}: {len(chosen)} files, over MAX_DATASET_FILES ({limits.MAX_DATASET_FILES})"
            )
        return cls(data.corpus, commit, tuple(chosen), held, root)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the commit and the file list: what the shard map is a function of."""
        rows = [self.commit, *(f"{f.path}\t{f.size}" for f in self.files)]
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()

    def local(self, file: DataFile) -> Path:
        """The file on this machine: downloaded once (a Hub dataset) and checked against the
        commit's listing (size, hash), or found in the folder with its listed size."""
        if self.root is not None:
            path = self.root / file.path
            try:
                size = path.stat().st_size
            except OSError as exc:
                raise DatasetError(f"{self.corpus}: {file.path}: {exc.strerror}") from None
            if size != file.size:
                raise DatasetError(
                    f"{self.corpus}: {file.path} is {size} bytes, it was {file.size} when the "
                    "dataset was listed"
                )
            return path
        return _download(self.corpus, self.commit, file)


def _folder_listing(root: Path) -> dict[str, DataFile]:
    if not root.exists():
        raise DatasetError(f"cannot read corpus {root}: no such file or folder")
    try:
        if root.is_file():
            return {root.name: DataFile(root.name, root.stat().st_size)}
        found = sorted(p for p in root.rglob("*") if p.is_file())
        return {
            p.relative_to(root).as_posix(): DataFile(p.relative_to(root).as_posix(),
                                                     p.stat().st_size)
            for p in found
            if not any(part.startswith(".") for part in p.relative_to(root).parts)
        }  # fmt: skip
    except OSError as exc:
        raise DatasetError(f"cannot read corpus folder {root}: {exc.strerror}") from None


def _hub_listing(corpus: str, repo: str, revision: str) -> dict[str, DataFile]:
    # Imported here: the Hub client is needed only for a Hub dataset.
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    from cnode.auth import resolve_hf_endpoint
    from cnode.node.hub import HubError, hub_errors

    url = resolve_hf_endpoint(None)
    try:
        with hub_errors(url, f"list the files of {repo}@{revision[:12]}"):
            items = list(
                HfApi(endpoint=url).list_repo_tree(
                    repo, revision=revision, repo_type="dataset", recursive=True
                )
            )
    except HubError as exc:
        raise DatasetError(f"cannot load corpus {corpus}: {exc}") from None
    out = {}
    for item in items:
        if isinstance(item, RepoFile):
            sha = item.lfs.sha256 if item.lfs is not None else ""
            out[item.path] = DataFile(item.path, item.size, sha, "" if sha else item.blob_id)
    return out


def _download(corpus: str, commit: str, file: DataFile) -> Path:
    from cnode.node.hub import HubError, download_file

    repo = parse_hub_corpus(corpus).repo  # type: ignore[union-attr]
    try:
        path = download_file(
            repo,
            file.path,
            repo_type="dataset",
            revision=commit,
            max_bytes=limits.MAX_DATASET_FILE_BYTES,
        )
    except HubError as exc:
        raise DatasetError(f"cannot load {file.path} of corpus {corpus}: {exc}") from None
    _check_download(corpus, file, path)
    return path


def _check_download(corpus: str, file: DataFile, path: Path) -> None:
    """The downloaded bytes must be the ones the commit lists: size, then hash."""
    size = path.stat().st_size
    if size != file.size:
        raise DatasetError(
            f"{corpus}: {file.path} downloaded {size} bytes, the commit lists {file.size}: the "
            "file list of the commit and what was downloaded differ"
        )
    if file.sha256:
        digest, want = hashlib.sha256(), file.sha256
    elif file.git_oid:
        digest, want = hashlib.sha1(f"blob {size}\0".encode()), file.git_oid  # git's blob id
    else:
        return
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != want:
        raise DatasetError(
            f"{corpus}: {file.path} downloaded bytes that are not the commit's (hash "
            f"{digest.hexdigest()[:12]}, listed {want[:12]}): the file list of the commit and "
            "what was downloaded differ"
        )


def read_texts(path: Path, name: str, fmt: str, column: str) -> Iterator[list[str]]:
    """The text column of the file at ``path`` (``name`` in errors), a record batch at a time.

    Null rows are skipped (no text); every other bad input is a DatasetError naming ``name``.
    """
    row = 0
    for batch in _batches(path, name, fmt, column):
        texts: list[str] = []
        for value in batch.cast(pa.binary()).to_pylist():
            if value is not None:
                try:
                    texts.append(value.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise DatasetError(
                        f"{name} row {row}: not UTF-8 text (byte {exc.start})"
                    ) from None
            row += 1
        yield texts


def _batches(path: Path, name: str, fmt: str, column: str) -> Iterator[Any]:
    if fmt == "parquet":
        yield from _parquet_batches(path, name, column)
        return
    try:
        reader = pa_json.open_json(
            str(path), read_options=pa_json.ReadOptions(block_size=limits.READ_BLOCK_BYTES)
        )
        for batch in reader:
            if column not in batch.schema.names:
                cols = ", ".join(batch.schema.names)
                raise DatasetError(f"{name}: no column {column!r} (columns: {cols})")
            yield batch.column(column)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(
            f"{name}{_bad_json_line(path)}: not JSON Lines ({_one_line(exc)})"
        ) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())  # pyarrow's messages span lines; an error is one


def _bad_json_line(path: Path) -> str:
    """' row N' for the first line of ``path`` that is not a JSON object (error path only:
    pyarrow's message counts rows within its block, not the file)."""
    with path.open("rb") as f:
        for row, line in enumerate(f):
            try:
                if line.strip() and not isinstance(json.loads(line), dict):
                    return f" row {row}"
            except ValueError:
                return f" row {row}"
    return ""


def _parquet_batches(path: Path, name: str, column: str) -> Iterator[Any]:
    try:
        parquet = pq.ParquetFile(str(path))
        meta = parquet.metadata
        # Column data must end where the footer starts: its length and "PAR1" are the last 8.
        size = path.stat().st_size - 8 - meta.serialized_size
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                chunk = meta.row_group(g).column(c)
                start = chunk.dictionary_page_offset or chunk.data_page_offset
                end = start + chunk.total_compressed_size
                if end > size:  # a footer that lies about the file's size
                    raise DatasetError(
                        f"{name}: not a valid Parquet file: its footer says row group {g} "
                        f"reaches byte {end}, its data ends at byte {size}"
                    )
        names = parquet.schema_arrow.names
        if column not in names:
            raise DatasetError(f"{name}: no column {column!r} (columns: {', '.join(names)})")
        for batch in parquet.iter_batches(batch_size=limits.READ_BATCH_ROWS, columns=[column]):
            yield batch.column(0)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{name}: not a valid Parquet file ({_one_line(exc)})") from None
