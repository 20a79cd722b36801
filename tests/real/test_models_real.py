"""The real embedded Qwen pair: conversion is lossless and the tokenizers fit together.

Slow the first time (assembly + conversion, ~2 min per model); later runs reuse the user cache
dir, so SPECCHAT_CACHE_DIR is deliberately left alone here.
"""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from specchat.decoding.stopping import stop_token_ids
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.configs import config_from_file, read_config
from specchat.models.embedded import EMBEDDED, ensure_embedded, gguf_path
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET

pytestmark = pytest.mark.real

QWEN_IM_END = 151645  # Qwen2.5 instruct models end a turn with <|im_end|>


def test_converted_draft_equals_the_gguf_dequantized_in_float32() -> None:
    directory = ensure_embedded(DEFAULT_DRAFT, progress=False)
    gguf_file = gguf_path(EMBEDDED[DEFAULT_DRAFT])

    converted = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
    direct = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                  dtype=torch.float32).state_dict()
    assert converted.keys() == direct.keys()
    differing = [key for key in direct if not torch.equal(converted[key], direct[key])]
    assert differing == []

    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token_id == QWEN_IM_END


def test_embedded_pair_tokenizers_are_compatible() -> None:
    draft = AutoTokenizer.from_pretrained(ensure_embedded(DEFAULT_DRAFT, progress=False))
    target = AutoTokenizer.from_pretrained(ensure_embedded(DEFAULT_TARGET, progress=False))
    check_tokenizers_compatible(draft, target)


def test_a_raw_completion_ends_at_endoftext_though_the_gguf_names_im_end_alone() -> None:
    directory = ensure_embedded(DEFAULT_TARGET, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = SimpleNamespace(generation_config=GenerationConfig.from_pretrained(directory))  # what stops read
    ids = stop_token_ids(model, tokenizer)
    named = {"<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|file_sep|>"}
    assert ids == {tokenizer.convert_tokens_to_ids(name) for name in named} and QWEN_IM_END in ids


PLANNED_FIELDS = ("tie_word_embeddings", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "max_position_embeddings")


@pytest.mark.parametrize("alias", [DEFAULT_DRAFT, DEFAULT_TARGET])
def test_the_shipped_config_plans_the_model_the_conversion_makes(alias) -> None:
    """The memory plan sizes a model from its shipped config before it is converted (models/plan.py),
    so that config must describe the converted checkpoint: both GGUFs store their LM head apart
    from the embedding, so neither model is tied (a tied 0.5B was planned 0.27 GB short in bf16)."""
    converted = config_from_file(ensure_embedded(alias, progress=False) / "config.json")
    shipped = read_config(alias)
    assert {f: getattr(shipped, f) for f in PLANNED_FIELDS} == {f: getattr(converted, f) for f in PLANNED_FIELDS}
