"""Training settings of a run: model, data, local steps, aggregation, checkpoints.

They travel inside the run configuration (its ``[training]`` table) so every node of a run trains
the same model the same way. Every field has a default: an empty table gives the tiny GPT-2-style
model that ``cnode demo`` trains on two cores.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cnode.aggregation import CODECS, AggregationInputError, result_codec, wire_codec

from . import limits
from ._exceptions import TrainingConfigError

__all__ = ["DataConfig", "HubCorpus", "ModelConfig", "TrainingConfig", "parse_hub_corpus"]

BUILTIN_CORPUS = "builtin:stdlib-docstrings"
HUB_CORPUS_PREFIX = "hf://datasets/"
_HUB_NAME = re.compile(r"[\w.-]+")
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubCorpus:
    """A training corpus: a Hub dataset repo, or one file of it, at one commit."""

    repo: str  # "owner/name"
    path: str  # the file's path in the repo; "" for the whole dataset
    revision: str  # a full commit sha: every peer trains on the same bytes


def parse_hub_corpus(corpus: str) -> HubCorpus | None:
    """The dataset file ``corpus`` names, or None when ``corpus`` is not an ``hf://`` name.

    Takes ``hf://datasets/OWNER/NAME/PATH@COMMIT`` and huggingface_hub's own spelling
    ``hf://datasets/OWNER/NAME@COMMIT/PATH``. Raises :class:`TrainingConfigError` for any other
    ``hf://`` name, and for a revision that is not a full 40-hex commit sha (a branch moves, and
    peers that read it at different times would train on different text).
    """
    if not corpus.startswith("hf://"):
        return None
    where = f"training.data.corpus {corpus!r}"
    parts = corpus.removeprefix(HUB_CORPUS_PREFIX).split("/", 2)
    if len(parts) == 2 and "@" in parts[1]:
        parts.append("")  # the whole dataset: hf://datasets/OWNER/NAME@COMMIT
    if not corpus.startswith(HUB_CORPUS_PREFIX) or len(parts) != 3:
        raise TrainingConfigError(
            f"{where}: a Hub corpus is hf://datasets/OWNER/NAME@COMMIT (a dataset), or "
            "hf://datasets/OWNER/NAME/PATH@COMMIT (one file of it)"
        )
    owner, name, path = parts
    revision = ""
    if "@" in name:
        name, revision = name.split("@", 1)
    elif "@" in path:
        path, revision = path.rsplit("@", 1)
    segments = path.split("/") if path else []
    if not (_HUB_NAME.fullmatch(owner) and _HUB_NAME.fullmatch(name)) or any(
        s in ("", ".", "..") for s in segments
    ):
        raise TrainingConfigError(f"{where}: not a dataset repo id and file path")
    if not _COMMIT_SHA.fullmatch(revision):
        pinned = f"{HUB_CORPUS_PREFIX}{owner}/{name}/{path}@<40-hex commit sha>"
        said = f"revision {revision!r} is not a commit" if revision else "no revision"
        raise TrainingConfigError(
            f"{where}: {said}; pin a commit ({pinned}) so every peer trains on the same bytes"
        )
    return HubCorpus(f"{owner}/{name}", path, revision)


def parse_pretrained(pretrained: str, *, key: str = "pretrained") -> tuple[str, str]:
    """``"OWNER/NAME@COMMIT"`` -> (repo id, commit); TrainingConfigError for anything else.

    The commit is required for the same reason as a Hub corpus's: every peer must start from
    the same weights, and a branch moves between peers that load it at different times.
    """
    where = f"training.model.{key} {pretrained!r}"
    repo, _, revision = pretrained.partition("@")
    owner, _, name = repo.partition("/")
    if not (_HUB_NAME.fullmatch(owner) and _HUB_NAME.fullmatch(name)):
        raise TrainingConfigError(f"{where}: a Hub model is OWNER/NAME@COMMIT")
    if not _COMMIT_SHA.fullmatch(revision):
        said = f"revision {revision!r} is not a commit" if revision else "no revision"
        raise TrainingConfigError(
            f"{where}: {said}; pin a commit ({repo}@<40-hex commit sha>) so every peer "
            "starts from the same weights"
        )
    return repo, revision


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-2-style decoder built from the legacy fields (no download), a model of any
    architecture built from its config (``architecture`` and its keys), or a Hub model id."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2
    n_positions: int = 64
    vocab_size: int = 1024  # must equal the tokenizer's vocabulary
    pretrained: str = ""  # a Hub model "OWNER/NAME@COMMIT"; empty = build from the fields above
    # A transformers architecture ("llama", "qwen2", ...) built from ``options``, its config keys
    # as sorted (key, JSON value) pairs (hashable); set by model_table, which then reads
    # n_positions and vocab_size from the built config (the other legacy fields are unused).
    architecture: str = ""
    options: tuple[tuple[str, str], ...] = ()
    tokenizer: str = ""  # a Hub tokenizer "OWNER/NAME@COMMIT" (tokenizer.json of that commit)

    def architecture_kwargs(self) -> dict[str, Any]:
        """``options`` decoded: the config keys as the [training.model] table gave them."""
        return {key: json.loads(value) for key, value in self.options}

    def approx_parameters(self) -> int:
        """Parameters of the model these fields build, without allocating it: for the legacy
        GPT-2, embeddings + 12 d^2 per block; for an architecture, counted on the meta device."""
        if self.architecture:
            from .model.architecture import count_parameters

            return count_parameters(self.architecture, self.architecture_kwargs())
        embd = self.n_embd
        return (self.vocab_size + self.n_positions) * embd + 12 * self.n_layer * embd**2

    def hf_config(self) -> dict[str, Any]:
        """The model's config as a checkpoint records it (``config.json`` of an export):
        ``model_type`` and the keys it is built with."""
        if self.architecture:
            from .model.architecture import recorded_config

            return recorded_config(self.architecture, self.architecture_kwargs())
        return {"model_type": "gpt2", **self.to_gpt2_kwargs()}

    def to_table(self) -> dict[str, Any]:
        """The [training.model] table that parses back to this config (to_dict's model)."""
        if not self.architecture:
            out = {f.name: getattr(self, f.name) for f in fields(self)}
            del out["architecture"], out["options"]
        else:
            out = {"architecture": self.architecture, **self.architecture_kwargs()}
            out["tokenizer"] = self.tokenizer
        if not self.tokenizer:
            del out["tokenizer"]  # absent from records made before the key existed
        return out

    def to_gpt2_kwargs(self) -> dict[str, Any]:
        # Dropout off: a round's update then depends on (state, data, seed) only.
        return {
            "n_layer": self.n_layer,
            "n_embd": self.n_embd,
            "n_head": self.n_head,
            "n_positions": self.n_positions,
            "vocab_size": self.vocab_size,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "bos_token_id": 0,  # <|endoftext|> is id 0 in the trained tokenizer
            "eos_token_id": 0,
            "loss_type": "ForCausalLM",
        }


def model_table(raw: Any) -> ModelConfig:
    """Parse a [training.model] table: the legacy GPT-2 fields, or ``architecture`` with its
    config keys (checked by building the model on the meta device: model/architecture.py)."""
    if not isinstance(raw, dict) or "architecture" not in raw:
        return _build(ModelConfig, raw, "training.model")  # type: ignore[no-any-return]
    from .model.architecture import model_fields  # lazily: model imports this module

    return ModelConfig(**model_fields(raw))


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it is cut."""

    # BUILTIN_CORPUS, a path to a UTF-8 text file present on every node, or one file of a Hub
    # dataset at a commit: "hf://datasets/OWNER/NAME/PATH@COMMIT" (see parse_hub_corpus).
    corpus: str = BUILTIN_CORPUS
    seq_len: int = 64  # tokens per training sequence (<= model n_positions)
    n_shards: int = 8  # the corpus is cut into this many shards (training sequence i: i mod n)
    eval_sequences: int = 64  # held-out sequences (the same on every node) for the loss report
    # Which shard a peer trains on in a round (specs/training.md, "Sequences and shards"):
    # "rotate" walks every peer through all shards, one per round, in an order drawn from (seed,
    # peer id, round // n_shards); "fixed" is the shard its id hashes to, every round (what runs
    # before it trained on, and what a recorded config without the key means: from_dict).
    assignment: str = "rotate"
    # A dataset of many files (corpus a Hub repo "hf://datasets/OWNER/NAME@COMMIT", a folder,
    # or one .parquet/.jsonl file; model/_files.py): which files (a glob on their paths; empty:
    # every .parquet, .jsonl and .json), which split (files in a folder of that name, or named
    # "SPLIT-*"), the column holding the text, and the held-out set: a file of the dataset
    # (not trained on), or empty: the first eval_sequences sequences of its first file.
    files: str = ""
    split: str = ""
    text_column: str = "text"
    held_out: str = ""


# DataConfig keys a record leaves out at their defaults, so the records of runs before them keep
# their bytes.
DATASET_KEYS = {"files": "", "split": "", "text_column": "text", "held_out": ""}


# training.partitioned values; "auto" partitions rounds of at least PARTITION_MIN_MEMBERS.
PARTITION_MODES = ("auto", "always", "never")
PARTITION_MIN_MEMBERS = 3
OUTER_OPTIMIZERS = ("sgd", "nesterov")
# What a [training] table that says outer_optimizer = "nesterov" and not these keys gets: DiLoCo's.
NESTEROV_DEFAULTS = {"outer_lr": 0.7, "outer_momentum": 0.9}
PRECISIONS = ("fp32", "bf16-mixed")
ASSIGNMENTS = ("rotate", "fixed")  # training.data.assignment
INNER_OPTIMIZER_STATES = ("keep", "fresh")  # training.inner_optimizer_state


@dataclass(frozen=True)
class TrainingConfig:
    """Everything that must be equal on all nodes of a run for their rounds to agree."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0  # initial weights and per-(peer, round) batch order derive from it
    local_steps: int = 16  # optimizer steps per round before the update is taken
    batch_size: int = 8  # sequences per step
    lr: float = 3e-3  # AdamW learning rate of the local steps
    # The local AdamW's moments between rounds (specs/training.md#inner-optimizer): "keep" carries
    # each node's own from its previous round (DiLoCo's workers do); "fresh" starts every round
    # anew (what runs before the key trained with, and what a record without it means).
    inner_optimizer_state: str = "keep"
    # The outer step (specs/training.md#outer-optimizer): "sgd" is state += outer_lr * aggregate;
    # "nesterov" is DiLoCo's outer Nesterov momentum, whose buffer is run state (checkpointed,
    # replayed). A [training] table that names "nesterov" without outer_lr / outer_momentum gets
    # DiLoCo's 0.7 and 0.9 (NESTEROV_DEFAULTS).
    outer_optimizer: str = "sgd"
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    # Local steps' arithmetic: "fp32", or "bf16-mixed" (autocast for forward and backward; the
    # master weights, the optimizer and the update stay float32). The run's default: a node may
    # override it (`cnode train --precision`), since nothing other nodes check depends on it.
    precision: str = "fp32"
    checkpoint_every: int = 1  # the checkpointer stores a checkpoint every N rounds
    aggregator: str = "centered_clip"
    aggregator_params: dict[str, Any] = field(default_factory=dict)
    # How updates travel (specs/training.md#update-codecs). "f32" is what a [training] table
    # without the key has always meant (old runs, and their checkpoints' extra.training, which
    # replay reads); new runs (cnode.node.new_run_training) write "sparse-topk", decay 0.95.
    update_codec: str = "f32"
    # sparse-topk only: the share of values each chunk of an update keeps (K = round(density x
    # 4096) per chunk; specs/training.md#update-codecs). Recorded with the run's config, so a
    # replay reads updates with the same bound.
    update_density: float = 1 / 64
    # Error feedback's decay (specs/training.md#error-feedback): a lossy codec encodes
    # ``delta + error_decay x residual``. 1 forgets nothing (the accumulated error is sent in
    # full, late); SparseLoCo's 0.95 lets old error fade, so top-k does not keep shipping stale
    # coordinates. 0 is no error feedback. Recorded only when not 1, so older runs keep their bytes.
    error_decay: float = 1.0
    # Partitioned rounds (specs/training.md#partitioned-rounds): "auto" partitions a round whose
    # published member list has at least PARTITION_MIN_MEMBERS members, "always" every round,
    # "never" none (full replication: every member aggregates everything). The coordinator reads
    # this key and decides each round's partition count when it publishes the member list.
    partitioned: str = "auto"
    # Partitions each member recomputes per round in a partitioned round (specs/training.md
    # #verification): more catches a lying aggregator sooner and costs about one update of
    # traffic per member each.
    verify_partitions: int = limits.VERIFY_PARTITIONS
    # Score updates, keep reputations, admit by them (specs/aggregation.md, _scores.py). On: the
    # one default, what a run gets unless its run config says `scores = false` (for_run).
    # to_dict always records it; only a record made before it was recorded lacks the key, and
    # from_dict reads that as off (such runs did not score), so old checkpoints replay as made.
    scores: bool = True

    @property
    def samples_per_round(self) -> int:
        return self.local_steps * self.batch_size

    @property
    def wire_codec(self) -> str:
        """The codec string updates are encoded, recorded and checked with (``sparse-topk:64``
        for sparse-topk at density 1/64; the codec's name for the others)."""
        return wire_codec(self.update_codec, self.update_density)

    @property
    def result_codec(self) -> str:
        """The codec string a partition's aggregate is encoded with (``cnode.aggregation.
        result_codec``): the update codec, or ``sparse-int8:2K`` in a sparse run."""
        return result_codec(self.wire_codec)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model"] = self.model.to_table()
        if self.update_codec != "sparse-topk" and self.update_density == 1 / 64:
            del out["update_density"]  # only sparse reads it: other runs keep their bytes
        # ``scores`` is always written: a record says whether its run scored, on or off.
        # Likewise the keys added with the outer optimizer and precision, at their old meaning.
        if self.outer_optimizer == "sgd" and self.outer_momentum == 0.0:
            del out["outer_optimizer"], out["outer_momentum"]
        if self.precision == "fp32":
            del out["precision"]
        if self.error_decay == 1.0:
            del out["error_decay"]
        for key, default in DATASET_KEYS.items():
            if out["data"][key] == default:
                del out["data"][key]
        if self.data.assignment == "fixed":
            del out["data"]["assignment"]  # a record without it means "fixed" (from_dict)
        if self.inner_optimizer_state == "fresh":
            del out["inner_optimizer_state"]  # a record without it means "fresh" (from_dict)
        return out

    @classmethod
    def for_run(cls, raw: dict[str, Any]) -> TrainingConfig:
        """Build from a run config's ``[training]`` table: an absent key takes the dataclass
        default (``scores`` on); unknown keys are an error."""
        return cls._parse(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainingConfig:
        """Build from a table as recorded (a checkpoint's ``extra.training``, what ``to_dict``
        wrote): as :meth:`for_run`, but an absent ``scores`` is off: ``to_dict`` always writes
        it, so only a record from before scores were recorded lacks it, and those runs did not
        score. Likewise an absent ``data.assignment`` is ``"fixed"`` and an absent
        ``inner_optimizer_state`` is ``"fresh"``, what those runs used."""
        if not isinstance(raw, dict):
            raise TrainingConfigError("[training] must be a table")
        data = raw.get("data", {})
        if isinstance(data, dict):  # (a non-table is refused by _parse, naming it)
            raw = {**raw, "data": {"assignment": "fixed", **data}}
        return cls._parse({"scores": False, "inner_optimizer_state": "fresh", **raw})

    @classmethod
    def _parse(cls, raw: dict[str, Any]) -> TrainingConfig:
        if not isinstance(raw, dict):
            raise TrainingConfigError("[training] must be a table")
        raw = dict(raw)
        if raw.get("outer_optimizer") == "nesterov":
            raw = {**NESTEROV_DEFAULTS, **raw}
        model = model_table(raw.pop("model", {}))
        data = _build(DataConfig, raw.pop("data", {}), "training.data")
        config = _build(cls, raw, "training", model=model, data=data)
        config.check()
        return config

    def check(self) -> None:
        """Raise :class:`TrainingConfigError` for values no run can train with."""
        m, d = self.model, self.data
        if m.tokenizer:
            parse_pretrained(m.tokenizer, key="tokenizer")
        if m.pretrained:
            parse_pretrained(m.pretrained)
        else:
            legacy = (m.n_layer, m.n_embd, m.n_head, m.n_positions, m.vocab_size)
            if not m.architecture and min(legacy) < 1:
                raise TrainingConfigError("training.model sizes must be positive")
            if not m.architecture and m.n_embd % m.n_head:
                raise TrainingConfigError("training.model.n_embd must be a multiple of n_head")
            approx = m.approx_parameters()
            if approx > limits.MAX_MODEL_PARAMETERS_CEILING:
                raise TrainingConfigError(
                    f"training.model has ~{approx} parameters, over MAX_MODEL_PARAMETERS_CEILING "
                    f"({limits.MAX_MODEL_PARAMETERS_CEILING})"
                )
            if m.n_positions and d.seq_len > m.n_positions:
                raise TrainingConfigError("training.data.seq_len must be <= model.n_positions")
        parse_hub_corpus(d.corpus)  # a malformed or unpinned Hub corpus fails before any download
        if d.seq_len < 2 or d.n_shards < 1 or d.eval_sequences < 1:
            raise TrainingConfigError(
                "training.data needs seq_len >= 2, n_shards >= 1, eval_sequences >= 1"
            )
        if not 1 <= self.local_steps <= limits.MAX_LOCAL_STEPS:
            raise TrainingConfigError(f"training.local_steps must be 1..{limits.MAX_LOCAL_STEPS}")
        if self.batch_size < 1 or self.checkpoint_every < 1:
            raise TrainingConfigError("training.batch_size and checkpoint_every must be >= 1")
        if self.update_codec not in CODECS:
            raise TrainingConfigError(
                f"training.update_codec {self.update_codec!r} is not one of {', '.join(CODECS)}"
            )
        try:
            self.wire_codec  # noqa: B018 (checks update_density)
        except AggregationInputError as exc:
            raise TrainingConfigError(f"training.update_density: {exc}") from exc
        if not 0 <= self.verify_partitions <= limits.MAX_VERIFY_PARTITIONS:
            raise TrainingConfigError(
                f"training.verify_partitions must be 0..{limits.MAX_VERIFY_PARTITIONS}"
            )
        if self.partitioned not in PARTITION_MODES:
            raise TrainingConfigError(
                f"training.partitioned {self.partitioned!r} is not one of "
                f"{', '.join(PARTITION_MODES)}"
            )
        if not (self.lr > 0 and self.outer_lr > 0):
            raise TrainingConfigError("training.lr and outer_lr must be > 0")
        self._check_outer_and_precision()

    def _check_outer_and_precision(self) -> None:
        if self.outer_optimizer not in OUTER_OPTIMIZERS:
            raise TrainingConfigError(
                f"training.outer_optimizer {self.outer_optimizer!r} is not one of "
                f"{', '.join(OUTER_OPTIMIZERS)}"
            )
        if not 0.0 <= self.outer_momentum < 1.0:
            raise TrainingConfigError(
                f"training.outer_momentum {self.outer_momentum!r} must be in [0, 1)"
            )
        if self.outer_optimizer == "sgd" and self.outer_momentum != 0.0:
            raise TrainingConfigError(
                'training.outer_momentum is for outer_optimizer = "nesterov"; "sgd" has none'
            )
        if not 0.0 <= self.error_decay <= 1.0:  # also refuses NaN
            raise TrainingConfigError(
                f"training.error_decay {self.error_decay!r} must be in [0, 1]"
            )
        if self.update_codec == "f32" and self.error_decay != 1.0:
            raise TrainingConfigError(
                'training.error_decay is for lossy codecs; update_codec = "f32" keeps no residual'
            )
        if self.precision not in PRECISIONS:
            raise TrainingConfigError(
                f"training.precision {self.precision!r} is not one of {', '.join(PRECISIONS)}"
            )
        if self.inner_optimizer_state not in INNER_OPTIMIZER_STATES:
            raise TrainingConfigError(
                f"training.inner_optimizer_state {self.inner_optimizer_state!r} is not one of "
                f"{', '.join(INNER_OPTIMIZER_STATES)}"
            )
        if self.data.assignment not in ASSIGNMENTS:
            raise TrainingConfigError(
                f"training.data.assignment {self.data.assignment!r} is not one of "
                f"{', '.join(ASSIGNMENTS)}"
            )


def _build(cls: type, raw: Any, where: str, **given: Any) -> Any:
    if not isinstance(raw, dict):
        raise TrainingConfigError(f"[{where}] must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise TrainingConfigError(f"[{where}]: unknown setting(s) {', '.join(unknown)}")
    defaults = cls(**given) if given else cls()
    for key, value in raw.items():
        want = type(getattr(defaults, key))
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok, raw[key] = True, float(value)
        if not ok:
            raise TrainingConfigError(f"[{where}] {key} must be {want.__name__}, got {value!r}")
    return cls(**given, **raw)
