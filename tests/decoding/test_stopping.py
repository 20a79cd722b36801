"""stop_token_ids: EOS ids from the generation config merged with the tokenizer's, and the
tokenizer's added tokens that end a turn or a document."""

from types import SimpleNamespace

import pytest

from specchat.decoding.stopping import stop_token_ids


def model_with(eos: object) -> SimpleNamespace:
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos))


def tokenizer_with(eos: int | None, added: dict[str, int] | None = None) -> SimpleNamespace:
    return SimpleNamespace(eos_token_id=eos, get_added_vocab=lambda: dict(added or {}))


@pytest.mark.parametrize(
    ("configured", "tokenizer_eos", "expected"),
    [
        (151645, None, {151645}),
        (151645, 151643, {151645, 151643}),
        ([151645, 151643], None, {151645, 151643}),
        ([151645, 151643], 151645, {151645, 151643}),  # duplicates merge
        ([151645, 151643], 2, {151645, 151643, 2}),
        (None, 151645, {151645}),
        (None, None, set()),
        ([], 7, {7}),
        (0, None, {0}),  # id 0 is a real token id, not "unset"
        (None, 0, {0}),
    ],
)
def test_stop_token_ids(configured: object, tokenizer_eos: int | None, expected: set[int]) -> None:
    ids = stop_token_ids(model_with(configured), tokenizer_with(tokenizer_eos))
    assert ids == frozenset(expected)
    assert isinstance(ids, frozenset)


def test_generation_config_without_eos_attribute() -> None:
    model = SimpleNamespace(generation_config=SimpleNamespace())
    assert stop_token_ids(model, tokenizer_with(5)) == frozenset({5})


def test_added_end_tokens_stop_as_a_ggufs_single_eos_does_not_say() -> None:
    # Qwen2.5-Coder's GGUF names <|im_end|> alone; a raw or fill-in-the-middle completion ends
    # with <|endoftext|>, and its FIM pad and file separator end a middle.
    added = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|fim_prefix|>": 151659,
             "<|fim_pad|>": 151662, "<|file_sep|>": 151664, "<tool_call>": 151657}
    assert stop_token_ids(model_with(151645), tokenizer_with(151645, added)) == {151643, 151645, 151662, 151664}


def test_an_ordinary_vocabulary_piece_named_like_an_end_token_is_not_added() -> None:
    # Only added (special) tokens count: a word of the base vocabulary never ends a reply.
    tokenizer = tokenizer_with(2, {"<s>": 1, "</s>": 2})
    tokenizer.get_vocab = lambda: {"<|endoftext|>": 50}
    assert stop_token_ids(model_with(None), tokenizer) == {2}
