"""The model: built from the run's config (the legacy GPT-2 fields, or any causal-LM architecture
and its config keys: ``architecture.py``) or loaded from the Hub, and its state as plain tensors.

A model's *state* here is ``{parameter name: float32 tensor}`` from ``named_parameters()``: tied
weights appear once (GPT-2 ties ``lm_head`` to ``transformer.wte``), and buffers are left out (the
attention mask, a rotary embedding's ``inv_freq``: rebuilt from the config). This dict is what
rounds aggregate, what checkpoints store, and what the state CID hashes.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from .._config import ModelConfig, TrainingConfig, parse_pretrained
from .._exceptions import TrainingConfigError
from .architecture import build_config, resolve_architecture

__all__ = ["build_model", "load_state", "model_state"]

State = dict[str, torch.Tensor]


def build_model(config: TrainingConfig) -> PreTrainedModel:
    """The run's initial model; the same seed gives the same weights on every node."""
    model_config: ModelConfig = config.model
    model: PreTrainedModel
    if model_config.pretrained:
        from transformers import AutoModelForCausalLM

        repo, revision = parse_pretrained(model_config.pretrained)
        try:
            model = AutoModelForCausalLM.from_pretrained(repo, revision=revision)
        except OSError as exc:
            raise TrainingConfigError(
                f"cannot load model {model_config.pretrained!r} from the Hub: {exc}"
            ) from exc
    elif model_config.architecture:
        from transformers import AutoModelForCausalLM

        arch = model_config.architecture
        resolved = resolve_architecture(arch, model_config.architecture_kwargs())
        hf = build_config(arch, resolved.kwargs_json)
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(hf)
    else:
        torch.manual_seed(config.seed)
        model = GPT2LMHeadModel(GPT2Config(**model_config.to_gpt2_kwargs()))
    model = model.float()
    model.train()
    return model


def model_state(model: torch.nn.Module) -> State:
    """A detached, contiguous float32 copy of the model's parameters on the CPU, by name."""
    return {
        name: p.detach().to("cpu", torch.float32).contiguous().clone()
        for name, p in model.named_parameters()
    }


def load_state(model: torch.nn.Module, state: State) -> None:
    """Copy ``state`` into the model's parameters; names and shapes must match exactly."""
    params = dict(model.named_parameters())
    if set(params) != set(state):
        missing = sorted(set(params) - set(state))[:3]
        extra = sorted(set(state) - set(params))[:3]
        raise TrainingConfigError(
            f"state does not fit the model (missing {missing}, unexpected {extra})"
        )
    with torch.no_grad():
        for name, p in params.items():
            if tuple(p.shape) != tuple(state[name].shape):
                shape = tuple(state[name].shape)
                raise TrainingConfigError(f"state layer {name} has shape {shape}")
            p.copy_(state[name])
