"""token_bytes: a byte-level BPE token's own bytes, and none for a row of a model's padded
vocabulary past the tokenizer's (Qwen2.5's 151,936 rows hold 151,665 tokens), where the top
logprobs may reach."""

from helpers.cli import CORPUS, train_tokenizer

from specchat.serve.token_bytes import token_bytes


def test_a_tokens_bytes_and_none_for_an_id_past_the_tokenizer():
    tokenizer = train_tokenizer(CORPUS)
    hello = tokenizer("hello")["input_ids"]
    assert b"".join(token_bytes(tokenizer, token) for token in hello) == b"hello"
    assert token_bytes(tokenizer, len(tokenizer) + 5) == b""
