"""Draft/target tokenizer compatibility, on small word-level tokenizers built in-process."""

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from specchat.errors import SpecchatError
from specchat.models.compat import check_tokenizers_compatible

WORDS = ["<unk>", "hello", "world", "def", "return", "<eos>", "<end>"]


def make_tokenizer(words: list[str], eos: str = "<eos>") -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token=eos)


def test_identical_tokenizers_are_compatible() -> None:
    check_tokenizers_compatible(make_tokenizer(WORDS), make_tokenizer(WORDS))


def test_extra_tokens_past_the_shared_range_are_allowed() -> None:
    # e.g. a target vocabulary padded with placeholder tokens to its embedding size
    check_tokenizers_compatible(make_tokenizer(WORDS), make_tokenizer([*WORDS, "[PAD7]", "[PAD8]"]))


def test_different_ids_are_detected() -> None:
    swapped = [WORDS[0], WORDS[2], WORDS[1], *WORDS[3:]]
    with pytest.raises(SpecchatError) as raised:
        check_tokenizers_compatible(make_tokenizer(WORDS), make_tokenizer(swapped))
    message = str(raised.value)
    assert "\n" not in message
    assert "2 of 7 shared token ids" in message
    assert "id 1 is 'hello' vs 'world'" in message


def test_different_eos_is_detected() -> None:
    with pytest.raises(SpecchatError, match="eos '<eos>' \\(id 5\\) vs '<end>' \\(id 6\\)"):
        check_tokenizers_compatible(make_tokenizer(WORDS), make_tokenizer(WORDS, eos="<end>"))
