"""stop_token_ids: EOS ids from the generation config merged with the tokenizer's."""

from types import SimpleNamespace

import pytest

from specchat.decoding.stopping import stop_token_ids


def model_with(eos: object) -> SimpleNamespace:
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos))


def tokenizer_with(eos: int | None) -> SimpleNamespace:
    return SimpleNamespace(eos_token_id=eos)


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
