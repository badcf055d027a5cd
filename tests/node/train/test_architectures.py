"""Models of any causal-LM architecture built from ``[training.model]`` (issue 39): Llama and
GPT-2 from their config keys; the state holds each parameter once and no buffer; a bad
architecture, key or value is one configuration error naming it; a checkpoint's export loads in
transformers with the same logits and imports back to the same tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from cnode.node.train import (
    TextData,
    TrainingConfig,
    TrainingConfigError,
    build_model,
    model_state,
    store_checkpoint,
    train_local,
)
from cnode.node.train.model import load_state, state_cid
from cnode.storage import BlockStore, export_hf, import_hf, load_checkpoint

LLAMA: dict[str, Any] = {
    "architecture": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "vocab_size": 300,
}
GPT2: dict[str, Any] = {
    "architecture": "gpt2",
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "n_positions": 32,
    "vocab_size": 300,
    "tie_word_embeddings": True,
}


def _config(model: dict[str, Any], **training: Any) -> TrainingConfig:
    data = {"seq_len": 32, "eval_sequences": 8, "n_shards": 4}
    return TrainingConfig.for_run({"model": model, "data": data, **training})


QWEN2 = {**LLAMA, "architecture": "qwen2"}
NEOX = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"} | {"architecture": "gpt_neox"}


@pytest.mark.parametrize(
    "table", [LLAMA, GPT2, QWEN2, NEOX], ids=["llama", "gpt2", "qwen2", "gpt_neox"]
)
def test_the_state_holds_each_parameter_once_and_no_buffer(table: dict[str, Any]) -> None:
    config = _config(table)
    model = build_model(config)
    state = model_state(model)
    unique = {id(p) for p in model.parameters()}
    assert len(state) == len(unique) == len(list(model.named_parameters()))
    assert not set(dict(model.named_buffers())) & set(state)  # rotary inv_freq, masks: rebuilt
    assert sum(t.numel() for t in state.values()) == config.model.approx_parameters()
    # The seed alone gives the round-0 state: the same CID in every process, another seed not.
    assert state_cid(model_state(build_model(config))) == state_cid(state)
    other = _config(table, seed=1)
    assert state_cid(model_state(build_model(other))) != state_cid(state)
    assert config.model.vocab_size == 300
    # A record of the config reads back to the same config (replay reads it so).
    assert TrainingConfig.from_dict(config.to_dict()) == config
    assert config.to_dict()["model"] == table


def test_gpt2_keys_the_legacy_way_keep_their_record_bytes() -> None:
    legacy = TrainingConfig.for_run({"model": {"n_layer": 1}})
    assert legacy.to_dict()["model"] == {
        "n_layer": 1, "n_embd": 64, "n_head": 2, "n_positions": 64, "vocab_size": 1024,
        "pretrained": "",
    }  # fmt: skip
    assert "files" not in legacy.to_dict()["data"]


def test_dropout_is_off_unless_the_table_sets_it() -> None:
    hf = _config(GPT2).model.hf_config()
    assert hf["resid_pdrop"] == hf["embd_pdrop"] == hf["attn_pdrop"] == 0.0
    assert _config({**GPT2, "resid_pdrop": 0.25}).model.hf_config()["resid_pdrop"] == 0.25
    assert _config(LLAMA).model.hf_config()["attention_dropout"] == 0.0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"architecture": "lama"}, "architecture 'lama' is not an architecture transformers"),
        ({"architecture": "t5"}, "'t5' has no causal language model"),
        ({**LLAMA, "hiden_size": 32}, "llama has no setting.s. hiden_size"),
        ({**LLAMA, "n_layer": 2}, "llama has no setting.s. n_layer"),
        ({**LLAMA, "num_attention_heads": 5}, r"\(llama\): .*not a multiple"),
        ({**LLAMA, "architecture": 3}, "architecture must be str"),
        ({**LLAMA, "pretrained": "a/b@" + "0" * 40}, "name one of them"),
        ({**LLAMA, "options": []}, "unknown setting.s. options"),
        ({**LLAMA, "tokenizer": "a/b@main"}, "training.model.tokenizer 'a/b@main'.*pin a commit"),
    ],
)
def test_a_bad_architecture_or_key_is_one_config_error_naming_it(
    table: dict[str, Any], message: str
) -> None:
    with pytest.raises(TrainingConfigError, match=message) as caught:
        _config(table)
    assert "\n" not in str(caught.value)


def test_a_llama_trains_a_round_and_its_export_loads_with_identical_logits(
    tmp_path: Path,
) -> None:
    config = _config(LLAMA, local_steps=2, batch_size=2)
    data = TextData.build(config.data, config.model)  # the shipped text, a tokenizer of 300
    model = build_model(config)
    start = model_state(model)
    local = train_local(model, start, data, config, peer_id="p", round_=1)
    state = {k: start[k] + local.delta[k] for k in start}
    assert state_cid(state) != state_cid(start)

    store = BlockStore(tmp_path / "store")
    cid = store_checkpoint(
        store, state, run="r", round_=1, parent=None, config=config, rounds=[],
        tokenizer_json=data.tokenizer_json,
    )  # fmt: skip
    out = export_hf(store, cid, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    assert type(loaded).__name__ == "LlamaForCausalLM"
    ours = build_model(config).eval()
    load_state(ours, state)
    ids = torch.tensor([[1, 5, 7, 42, 299, 3, 0, 17]])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, loaded(ids).logits)
    # ... and imports back to the same tensors, which load into the model built from the config.
    back, _ = load_checkpoint(store, import_hf(store, out, run_id="again"))
    assert state_cid({k: back[k] for k in state}) == state_cid(state)
