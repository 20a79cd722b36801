"""Chat messages -> prompt ids through the model's chat template: one home for `generate`, the
chat app and the server, so the three send a model the same tokens for the same messages."""

from transformers import PreTrainedTokenizerBase


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> list[int]:
    """Prompt ids for chat `messages` ({"role", "content"}), ready for the assistant's turn."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])
