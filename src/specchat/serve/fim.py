"""Fill in the middle: a code model completes the text between a prefix and a suffix when both come
in its training format, prefix-suffix-middle (PSM): <prefix token> prefix <suffix token> suffix
<middle token>, after which it writes the middle and ends it with its end-of-text token."""

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class FimTokens:
    prefix: str
    suffix: str
    middle: str

    def prompt(self, prefix: str, suffix: str) -> str:
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


# Each family's special tokens, in PSM order.
FAMILIES = (
    FimTokens("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    FimTokens("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, StarCoder2
    FimTokens("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)


def fim_tokens(tokenizer: PreTrainedTokenizerBase) -> FimTokens | None:
    """The family whose three tokens the tokenizer holds as added tokens; None for a model not
    trained to fill in the middle."""
    added = tokenizer.get_added_vocab()
    return next((family for family in FAMILIES
                 if {family.prefix, family.suffix, family.middle} <= added.keys()), None)
