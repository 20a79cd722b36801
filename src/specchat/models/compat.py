"""Checking that a draft model speaks the target's tokens: speculation compares token ids, so the
two tokenizers must agree on every id both know, and on where a reply ends."""

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from specchat.errors import SpecchatError

# What transformers builds a tokenizer's tokens from, beside a model's weights (a chat template
# aside: only the target's formats chats)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json")


def same_tokenizer_files(first: Path, second: Path) -> bool:
    """Whether two model directories tokenize alike by construction: byte-identical tokenizer
    files (the embedded pair's are). Then the target's loaded tokenizer serves the draft, and a
    second (0.13 GB for Qwen2.5's) need not load."""
    if not (first / "tokenizer.json").is_file() and not (first / "tokenizer.model").is_file():
        return False
    if first.resolve() == second.resolve():  # the tokenizer loaded before the plan, for its own model
        return True
    for name in TOKENIZER_FILES:
        mine, theirs = first / name, second / name
        if mine.is_file() != theirs.is_file() or mine.is_file() and mine.read_bytes() != theirs.read_bytes():
            return False
    return True


def check_tokenizers_compatible(draft_tok: PreTrainedTokenizerBase, target_tok: PreTrainedTokenizerBase) -> None:
    """Raise SpecchatError (one line) unless both map the shared id range alike and share eos.

    Only the tokenizers are compared: a model's embedding may have extra padding rows past its
    vocabulary (Qwen2.5: 151936 rows), which never appear as tokens.
    """
    draft_ids, target_ids = tokens_by_id(draft_tok), tokens_by_id(target_tok)
    shared = min(max(draft_ids, default=-1), max(target_ids, default=-1)) + 1
    differing = [i for i in range(shared) if draft_ids.get(i) != target_ids.get(i)]
    if differing:
        first = differing[0]
        raise SpecchatError(
            f"draft and target tokenizers differ: {len(differing)} of {shared} shared token ids map to different "
            f"tokens (first: id {first} is {draft_ids.get(first)!r} vs {target_ids.get(first)!r}); "
            "pick a draft from the target's model family"
        )
    draft_eos, target_eos = (draft_tok.eos_token, draft_tok.eos_token_id), (target_tok.eos_token, target_tok.eos_token_id)
    if draft_eos != target_eos:
        raise SpecchatError(
            f"draft and target tokenizers end replies differently: eos {draft_eos[0]!r} (id {draft_eos[1]}) "
            f"vs {target_eos[0]!r} (id {target_eos[1]})"
        )


def tokens_by_id(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    return {token_id: token for token, token_id in tokenizer.get_vocab().items()}
