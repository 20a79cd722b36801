"""The tokens that end a reply."""

from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Special tokens that end a turn or a document whatever the configs name as EOS. A GGUF names one
# EOS (Qwen2.5-Coder's: <|im_end|>), yet the model ends a raw or fill-in-the-middle completion
# with <|endoftext|>; the upstream generation configs list both (Qwen2.5 instruct: [151645,
# 151643]; Llama-3.1 instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>), and llama.cpp ends
# generation at these names too. A fill-in-the-middle pad or a new file's separator ends the middle.
END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
              "<|fim_pad|>", "<|file_sep|>")


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """EOS ids from the generation config (chat models often list several) and the tokenizer, and
    the tokenizer's added tokens named in END_TOKENS."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    added = tokenizer.get_added_vocab()
    ids.update(added[name] for name in END_TOKENS if name in added)
    return frozenset(ids)
