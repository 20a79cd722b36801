"""A tiny draft checkpoint on disk, as the loader's draft-form tests read one."""

import torch
from helpers.cli import CORPUS, train_tokenizer
from helpers.tiny import tiny_qwen_config
from transformers import Qwen2ForCausalLM

from specchat.decoding.events import SamplingParams

CPU = torch.device("cpu")
GREEDY, SEEDED = SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.9, 7)


def saved_model(directory):
    """A 2-layer Qwen2 wide enough for 4-bit groups (64 inputs, MLP 128) and its tokenizer."""
    tokenizer = train_tokenizer(CORPUS)
    torch.manual_seed(3)
    config = tiny_qwen_config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_attention_heads=2,
                              num_key_value_heads=1, eos_token_id=tokenizer.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return config
