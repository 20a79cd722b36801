"""Chat messages -> prompt ids through the model's chat template: one home for `generate`, the
chat app and the server, so the three send a model the same tokens for the same messages."""

from transformers import PreTrainedTokenizerBase


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """Prompt ids for chat `messages` ({"role", "content"}, and an assistant's "tool_calls"), ready
    for the assistant's turn; `tools` (OpenAI's {"type": "function", "function": ...}) go where
    the model's template declares them."""
    extra = {"tools": tools} if tools else {}
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                            **extra)
    return list(encoded["input_ids"])


def chat_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The prompt `encode_chat` encodes for `messages` and `tools`, as text (llama.cpp's /apply-template)."""
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
