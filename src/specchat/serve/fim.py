"""Fill in the middle: a code model completes the text between a prefix and a suffix when both come
in its training format, prefix-suffix-middle (PSM): <prefix token> prefix <suffix token> suffix
<middle token>, after which it writes the middle and ends it with its end-of-text token. Some
families also learnt repository-level context: a repository's name, then files each opened by a
file separator and its name, before the file being completed (Qwen2.5-Coder, StarCoder2)."""

from dataclasses import astuple, dataclass

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class FimTokens:
    prefix: str
    suffix: str
    middle: str
    repo: str | None = None  # before a repository's name
    file_sep: str | None = None  # before each file's name and text

    def prompt(self, prefix: str, suffix: str) -> str:
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


# Each family's special tokens, in PSM order.
FAMILIES = (
    FimTokens("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"),  # Qwen2.5-Coder
    FimTokens("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"),  # StarCoder2
    FimTokens("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder
    FimTokens("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)


def fim_tokens(tokenizer: PreTrainedTokenizerBase) -> FimTokens | None:
    """The first family whose tokens the tokenizer holds, all of them, as added tokens; None for a
    model not trained to fill in the middle."""
    added = tokenizer.get_added_vocab()
    return next((family for family in FAMILIES if set(filter(None, astuple(family))) <= added.keys()), None)
