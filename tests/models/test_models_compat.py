"""Draft/target tokenizer compatibility, on small word-level tokenizers built in-process."""

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from specchat.errors import SpecchatError
from specchat.models.compat import check_tokenizers_compatible, same_tokenizer_files

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


def test_tokenizer_files_are_the_same_only_when_every_one_is_byte_identical(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for directory in (first, second):
        directory.mkdir()
        (directory / "tokenizer.json").write_text('{"model": {}}')
        (directory / "tokenizer_config.json").write_text("{}")
    (first / "chat_template.jinja").write_text("{{ messages }}")  # a chat template is not the tokens
    assert same_tokenizer_files(first, second) and same_tokenizer_files(first, first)
    (second / "special_tokens_map.json").write_text("{}")  # present in one only
    assert not same_tokenizer_files(first, second)
    (first / "special_tokens_map.json").write_text('{"eos_token": "x"}')  # present in both, different
    assert not same_tokenizer_files(first, second)
    assert not same_tokenizer_files(tmp_path, tmp_path)  # no tokenizer at all
