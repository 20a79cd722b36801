"""The --pair check's checkpoints, one alias pair at a time, from the shipped configs with random
weights (nothing is downloaded): each model in its alias's own layout (a GPTQ or AWQ checkpoint of
random 4-bit weights, or bf16 safetensors), beside a word-level tokenizer over the alias's
vocabulary, so that `specchat generate` loads them as it would the published models."""

import json
from pathlib import Path

import torch
from gpu_checks.scale_models import alias_config, random_draft, write_random_4bit
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PretrainedConfig, PreTrainedTokenizerFast

from specchat.models.configs import shipped_config_path

UNKNOWN = "<unk>"


def alias_layers(alias: str) -> int:
    return json.loads(shipped_config_path(alias).read_text())["num_hidden_layers"]


def write_model(alias: str, layers: int | None, shrink: dict, directory: Path, device: torch.device) -> Path:
    """`alias` with random weights in `directory`: `layers` decoder layers (None: all of its own)
    and `shrink`'s config overrides; 4-bit where the alias is (one draw a shape: the check times the
    pair and compares no logits), else bf16 (drawn on `device`)."""
    config, settings = alias_config(alias, layers or alias_layers(alias), shrink)
    if settings is not None:
        write_random_4bit(config, settings, directory, distinct=False)
    else:
        random_draft(config, device).save_pretrained(directory)
    write_tokenizer(config, directory)
    return directory


def write_tokenizer(config: PretrainedConfig, directory: Path) -> None:
    """A tokenizer of the config's vocabulary: token i is the word `w{i}` (words split on spaces),
    but the config's begin and end tokens and an unknown word at 0 where neither is."""
    names = {i: f"w{i}" for i in range(config.vocab_size)}
    bos, eos = first_id(config.bos_token_id), first_id(config.eos_token_id)
    names |= {0: UNKNOWN, bos: "<s>", eos: "</s>"}
    tokenizer = Tokenizer(models.WordLevel({name: i for i, name in names.items()}, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token=UNKNOWN)
    fast.save_pretrained(directory)


def first_id(ids: int | list[int]) -> int:
    return ids[0] if isinstance(ids, list) else ids


def prompt_words(count: int) -> str:
    """A raw prompt of `count` words the tokenizer maps one to one onto ids 3 .. count + 2."""
    return " ".join(f"w{i}" for i in range(3, count + 3))
