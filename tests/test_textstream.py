"""Incremental detokenization with byte-level BPE tokenizers: a tiny one trained here (always),
and the real Qwen tokenizer of the embedded pair (`real`: converting the model is slow the
first time)."""

import pytest
from helpers.cli import CORPUS
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from specchat.models.embedded import ensure_embedded
from specchat.models.registry import DEFAULT_DRAFT
from specchat.textstream import TextStream

# Several of these characters are split across byte-level tokens by Qwen's vocabulary
# (e.g. 🦜, 🫠, 🪐, 龘), so single-token decodes end in an incomplete UTF-8 sequence.
TEXTS = [
    "Héllo wörld — naïve café, Ångström, señor.",
    "中文字符测试：龘鱻，日本語のテキスト、한국어 문장.",
    "Emoji 😀🦜🫠🪐🧬 and a family 👨\u200d👩\u200d👧 and flags 🇫🇷🇯🇵.",
    "def f(x):\n    return x ** 2  # ∑ ≤ ∞ → λ\n",
    "🦜",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # Qwen's


def tiny_tokenizer() -> PreTrainedTokenizerBase:
    """Byte-level BPE trained on ASCII code and prose: every non-ASCII character stays split
    into byte tokens, the hard case for incremental decoding."""
    backend = ByteLevelBPETokenizer()
    backend.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=SPECIAL_TOKENS,
                                show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=backend._tokenizer, eos_token="<|endoftext|>")


def qwen_tokenizer() -> PreTrainedTokenizerBase:
    """The embedded pair's tokenizer, found (or converted once) in the user cache as the app does."""
    return AutoTokenizer.from_pretrained(ensure_embedded(DEFAULT_DRAFT, progress=False))


@pytest.fixture(scope="module", params=["tiny", pytest.param("qwen", marks=pytest.mark.real)])
def tokenizer(request) -> PreTrainedTokenizerBase:
    return tiny_tokenizer() if request.param == "tiny" else qwen_tokenizer()


def stream_in_chunks(tokenizer, ids: list[int], sizes: list[int]) -> list[str]:
    """Push `ids` in consecutive chunks of the given sizes (the last size repeats)."""
    stream, deltas, start, index = TextStream(tokenizer), [], 0, 0
    while start < len(ids):
        size = sizes[min(index, len(sizes) - 1)]
        deltas.append(stream.push(ids[start : start + size]))
        start, index = start + size, index + 1
    return deltas


def test_fixture_texts_really_split_characters(tokenizer) -> None:
    """Guards the tests below: some single-token decodes must be incomplete characters."""
    ids = tokenizer.encode(TEXTS[2])
    assert any("\ufffd" in tokenizer.decode([token]) for token in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    deltas = stream_in_chunks(tokenizer, ids, [1])
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)  # partial characters held back


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("sizes", [[2], [3], [5], [1, 4, 2, 7]])
def test_in_chunks(tokenizer, text: str, sizes: list[int]) -> None:
    ids = tokenizer.encode(text)
    assert "".join(stream_in_chunks(tokenizer, ids, sizes)) == text


@settings(max_examples=40, deadline=None)
@given(text=st.sampled_from(TEXTS), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=20))
def test_emitted_text_is_always_a_prefix_of_the_final_text(tokenizer, text: str, sizes: list[int]) -> None:
    ids = tokenizer.encode(text)
    emitted = ""
    for delta in stream_in_chunks(tokenizer, ids, sizes):
        emitted += delta
        assert text.startswith(emitted)
    assert emitted == text


def test_split_character_is_held_back_until_complete(tokenizer) -> None:
    ids = tokenizer.encode("🦜")
    assert len(ids) >= 2
    stream = TextStream(tokenizer)
    assert [stream.push([token]) for token in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1:]) == "🦜"


def test_special_tokens_are_skipped(tokenizer) -> None:
    special = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")]
    assert all(isinstance(token, int) and token >= 0 for token in special)
    body = tokenizer.encode("Hi 🦜 naïve 中文")
    ids = [special[0], *body, special[1], special[2]]
    deltas = stream_in_chunks(tokenizer, ids, [1])
    assert "".join(deltas) == "Hi 🦜 naïve 中文"
    assert deltas[0] == "" and deltas[-2:] == ["", ""]


def test_text_property_is_the_full_decode(tokenizer) -> None:
    stream = TextStream(tokenizer)
    ids = tokenizer.encode(TEXTS[1])
    stream.push(ids)
    assert stream.text == TEXTS[1]
    assert stream.token_ids == ids


def test_finish_releases_a_character_cut_by_the_limit(tokenizer) -> None:
    stream = TextStream(tokenizer)
    ids = tokenizer.encode("🦜")
    assert len(ids) > 1
    assert stream.push(ids[:1]) == ""
    assert stream.finish() == tokenizer.decode(ids[:1])
    assert stream.finish() == ""


@pytest.mark.parametrize("text", TEXTS)
def test_offsets_never_fall_so_reaching_bisects_to_the_linear_count(tokenizer, text: str) -> None:
    """serve/reply.py counts a reply's tokens by `reaching`, a bisection over `offset`: it holds
    where offsets never fall as tokens are added, split characters and special tokens included."""
    special = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stream = TextStream(tokenizer)
    stream.push([*tokenizer.encode(text), special])
    offsets = [stream.offset(count) for count in range(len(stream.token_ids) + 1)]
    assert offsets == sorted(offsets) and offsets[-1] == len(text)
    for chars in range(len(text) + 2):
        assert stream.reaching(chars) == sum(offset < chars for offset in offsets[:-1])


def test_an_offset_is_where_a_token_begins_a_split_character_where_it_completes() -> None:
    tokenizer = tiny_tokenizer()
    stream = TextStream(tokenizer)
    parrot = tokenizer.encode("🦜")
    stream.push([*tokenizer.encode("ab"), *parrot])
    assert [stream.offset(count) for count in range(len(stream.token_ids) + 1)] == [0, 1] + [2] * len(parrot) + [3]
