"""Models built from a config: any causal-LM architecture ``transformers`` builds, no download.

``[training.model]`` with ``architecture = "llama"`` (``"gpt2"``, ``"qwen2"``, ``"mistral"``,
``"gpt_neox"``, ...) and that architecture's config keys (``hidden_size = 64``, ...) is built
with ``AutoConfig.for_model`` and ``AutoModelForCausalLM.from_config``. Every key is checked
against the architecture's config class: an unknown architecture, one without a causal-LM
model, a key the class does not have, or values it refuses are one :class:`TrainingConfigError`
naming them, when the run config is read. Dropout keys the table does not set are 0 (an update
then depends on its inputs only, as with the GPT-2 of the legacy fields); they are written into
the config, so an exported ``config.json`` says so.

``transformers`` is imported here only when a table names an architecture: reading a run config
without one stays cheap. A public module of ``model`` (it imports nothing of ``cnode.node.train``
but its errors): ``_config`` reads tables with it, lazily.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from huggingface_hub.errors import StrictDataclassError

from .._exceptions import TrainingConfigError

__all__ = [
    "build_config",
    "count_parameters",
    "hf_kwargs",
    "model_fields",
    "parameter_count",
    "recorded_config",
    "resolve_architecture",
]

# Config keys that are the library's bookkeeping, not the model's: a table may not set them.
_NOT_SETTINGS = frozenset({"transformers_version", "architectures", "model_type", "dtype"})
_DROPOUT_SUFFIXES = ("dropout", "pdrop")
# Named in the error for an unknown architecture (the full list has hundreds).
_EXAMPLES = ("llama", "gpt2", "qwen2", "mistral", "gpt_neox")


# How a config class refuses values: its own checks raise ValueError, huggingface_hub's strict
# dataclass validators (transformers 5's configs) StrictDataclassError, a wrong type TypeError.
_REFUSALS = (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError)


def _refused(architecture: str, exc: Exception) -> TrainingConfigError:
    said = " ".join(str(exc).split())  # validators write several lines; a config error is one
    return TrainingConfigError(f"[training.model] ({architecture}): {said}")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What the rest of a run needs from an architecture's config, read once."""

    kwargs_json: str  # the keys for AutoConfig.for_model, dropouts included, canonical JSON
    vocab_size: int
    n_positions: int  # the longest sequence the model takes (0: the config does not say)


def _config_class(architecture: str) -> type:
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if architecture not in CONFIG_MAPPING:
        raise TrainingConfigError(
            f"training.model.architecture {architecture!r} is not an architecture transformers "
            f"builds (e.g. {', '.join(_EXAMPLES)})"
        )
    if architecture not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise TrainingConfigError(
            f"training.model.architecture {architecture!r} has no causal language model "
            "(AutoModelForCausalLM does not build it)"
        )
    return CONFIG_MAPPING[architecture]  # type: ignore[no-any-return]


def _settings(cls: type) -> set[str]:
    """The keys ``cls`` takes: its fields (a dataclass config) or its __init__ parameters, and
    the aliases of its attribute_map (GPT-2's hidden_size for n_embd)."""
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
    else:
        names = set(inspect.signature(cls).parameters) - {"self", "kwargs"}
    names |= set(getattr(cls, "attribute_map", {}) or {})
    return names - _NOT_SETTINGS


def hf_kwargs(architecture: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The keys ``AutoConfig.for_model(architecture, **keys)`` is called with: ``options`` and
    a 0 for every dropout the options leave out. Raises TrainingConfigError naming a bad key."""
    cls = _config_class(architecture)
    known = _settings(cls)
    unknown = sorted(set(options) - known)
    if unknown:
        raise TrainingConfigError(
            f"[training.model]: {architecture} has no setting(s) {', '.join(unknown)}"
        )
    try:
        defaults = cls(**options).to_dict()
    except _REFUSALS as exc:
        raise _refused(architecture, exc) from None
    out = dict(options)
    for key, value in defaults.items():
        dropout = key.endswith(_DROPOUT_SUFFIXES) and isinstance(value, float)
        if dropout and key not in options and key in known:
            out[key] = 0.0
    return out


@lru_cache(maxsize=16)
def _resolve(architecture: str, options_json: str) -> Resolved:
    kwargs = hf_kwargs(architecture, json.loads(options_json))
    config = _config(architecture, kwargs)
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise TrainingConfigError(f"[training.model] ({architecture}): no vocab_size")
    positions = 0
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            positions = value
            break
    parameter_count(architecture, json.dumps(kwargs, sort_keys=True))  # it must build
    return Resolved(json.dumps(kwargs, sort_keys=True), vocab, positions)


def resolve_architecture(architecture: str, options: Mapping[str, Any]) -> Resolved:
    """Check ``options`` against ``architecture`` (building the model on the meta device, which
    allocates nothing) and return what the run reads from its config."""
    return _resolve(architecture, json.dumps(dict(options), sort_keys=True))


def _config(architecture: str, kwargs: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(architecture, **kwargs)
    except _REFUSALS as exc:
        raise _refused(architecture, exc) from None


def build_config(architecture: str, kwargs_json: str) -> Any:
    """The transformers config of a resolved architecture."""
    return _config(architecture, json.loads(kwargs_json))


@lru_cache(maxsize=16)
def parameter_count(architecture: str, kwargs_json: str) -> int:
    """Parameters of the model (tied ones once), counted on the meta device: nothing is
    allocated, so a config too big for this machine is still counted (and refused by name)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(architecture, kwargs_json)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (*_REFUSALS, RuntimeError) as exc:
        raise _refused(architecture, exc) from None
    return sum(p.numel() for p in model.parameters())


def count_parameters(architecture: str, options: Mapping[str, Any]) -> int:
    """Parameters of the model ``architecture`` and ``options`` build (meta device)."""
    return parameter_count(architecture, resolve_architecture(architecture, options).kwargs_json)


def recorded_config(architecture: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The config a checkpoint records (an export's ``config.json``): ``model_type`` and the
    keys the model is built with, dropouts included."""
    kwargs = json.loads(resolve_architecture(architecture, options).kwargs_json)
    return {"model_type": architecture, **kwargs}


def model_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a [training.model] table that names an ``architecture``: its
    other keys are that architecture's config keys, checked here."""
    own = {k: raw[k] for k in ("architecture", "pretrained", "tokenizer") if k in raw}
    for key, value in own.items():
        if not isinstance(value, str):
            raise TrainingConfigError(f"[training.model] {key} must be str, got {value!r}")
    if own.get("pretrained"):
        raise TrainingConfigError(
            "[training.model]: architecture builds a model from its config, pretrained loads "
            "one from the Hub; name one of them"
        )
    if "options" in raw:  # ModelConfig's own field, not a key a table may set
        raise TrainingConfigError("[training.model]: unknown setting(s) options")
    options = {k: v for k, v in raw.items() if k not in own}
    resolved = resolve_architecture(own["architecture"], options)
    return {
        "n_positions": resolved.n_positions,
        "vocab_size": resolved.vocab_size,
        "architecture": own["architecture"],
        "options": tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in options.items())),
        "tokenizer": own.get("tokenizer", ""),
    }
