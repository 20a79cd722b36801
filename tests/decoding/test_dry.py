"""DRY (decoding/dry.py) against its definition written out here, naively: for each earlier
position, how long the tokens ending there match the context's last ones, counted back no further
than the last breaker; llama.cpp's worked example; the breakers found in a tokenizer's words; and
SpecExec under DRY emitting autoregressive decoding's tokens."""

import random

import pytest
import torch
from helpers.engines import GREEDY, run
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.dry import Dry, DryWindow, dry_of, restart_sequences
from specchat.decoding.events import SamplingParams
from specchat.decoding.penalties import Penalties, counted_from
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine


def naive_penalties(tokens: list[int], dry: Dry, vocab: int) -> torch.Tensor:
    """What each token loses, from the definition: the longest L such that the L tokens before some
    earlier occurrence of it are the context's last L, L no longer than the span after the last
    breaker; multiplier x base^(L - allowed) where L >= allowed."""
    tails: dict[int, list[tuple[int, ...]]] = {}
    for head, tail in dry.restarts:
        tails.setdefault(head, []).append(tail)
    limit = len(tokens)
    for back in range(len(tokens)):  # the most recent breaker, its tail tokens written after it
        found = [len(t) for t in tails.get(tokens[-1 - back], []) if len(t) <= back
                 and list(t) == tokens[len(tokens) - back:len(tokens) - back + len(t)]]
        if found:
            limit = back - max(found)
            break
    penalty = torch.zeros(vocab)
    if len(tokens) <= dry.allowed_length or limit < dry.allowed_length:
        return penalty
    for end in range(len(tokens) - 1):
        length = 0
        while length < end + 1 and tokens[end - length] == tokens[len(tokens) - 1 - length]:
            length += 1
        length, token = min(length, limit), tokens[end + 1]
        if length >= dry.allowed_length and (token, ()) not in dry.restarts:
            penalty[token] = max(float(penalty[token]), dry.multiplier * dry.base ** (length - dry.allowed_length))
    return penalty


def penalty_of(dry: Dry, tokens: list[int], vocab: int) -> torch.Tensor:
    scores = torch.zeros(vocab)
    DryWindow(dry, tokens).penalize(scores)
    return -scores


def test_llama_cpps_worked_example():
    """llama.cpp's comment: in "a b c c b c y a b c", the last "a b c" also stands before the second
    c, "c" before b, "b c" before y; with allowed length 2, c and y are penalized, b is not."""
    a, b, c, y = range(4)
    penalty = penalty_of(Dry(0.8, 1.75, 2), [a, b, c, c, b, c, y, a, b, c], 4)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, 0.8 * 1.75, 0.8]))


# breakers: none, a token alone, one of two tokens, of three, and one head leading two tails
RESTARTS = ((), ((3, ()),), ((2, (1,)),), ((2, (1, 3)),), ((2, (1,)), (2, (1, 0))))


@pytest.mark.parametrize("seed", range(50))
def test_the_penalty_is_the_definitions_on_repetitive_sequences(seed):
    generator = random.Random(seed)
    tokens = [generator.randrange(4) for _ in range(generator.randrange(3, 80))]
    restarts = RESTARTS[seed % len(RESTARTS)]
    dry = Dry(generator.choice([0.5, 0.8, 2.0]), generator.choice([1.0, 1.75, 3.0]), generator.choice([0, 1, 2, 4]),
              restarts=restarts)
    torch.testing.assert_close(penalty_of(dry, tokens, 4), naive_penalties(tokens, dry, 4))


def test_a_breaker_stops_the_repeat_and_is_never_penalized_itself():
    a, b, c, d = range(4)
    assert penalty_of(Dry(1.0, 2.0, 2), [a, b, c, d, a, b, c], 4).tolist() == [0.0, 0.0, 0.0, 2.0]  # "a b c" -> d
    broken = Dry(1.0, 2.0, 2, restarts=((a, ()),))  # a breaks: the repeat counts "b c" only
    assert penalty_of(broken, [a, b, c, d, a, b, c], 4).tolist() == [0.0, 0.0, 0.0, 1.0]
    assert penalty_of(broken, [b, c, a, b, c], 4)[a] == 0  # a breaker by itself, though "b c" stood before it


@pytest.mark.parametrize("restarts", [((2, (1,)),), ((2, (1, 3)),), ((2, (1,)), (2, (1, 3)))],
                         ids=["two tokens", "three tokens", "two tails"])
def test_a_sequence_ending_in_its_breaker_repeats_nothing(restarts):
    """The breaker's last tokens are the sequence's last: no repeat reaches past it, not even one
    token long, though the same breaker and the tokens before it stood earlier (without the
    breaker, the last four to six tokens repeat the first ones). Where two of its tails match, the
    longer one is the breaker."""
    breaker = [2, *max((tail for _, tail in restarts), key=len)]
    tokens = [0, 3, *breaker, 0, 3, *breaker]
    assert penalty_of(Dry(1.0, 2.0, 1, restarts=restarts), tokens, 4).tolist() == [0.0] * 4
    assert penalty_of(Dry(1.0, 2.0, 2), tokens, 4)[0] > 0


def test_dry_is_on_from_a_base_of_1_and_a_window_of_1():
    """llama.cpp's bounds: a base below 1 or a window of 0 turns DRY off; a base of exactly 1 is a
    flat penalty of the multiplier whatever the repeat's length, a window of 1 token is on."""
    assert not Dry(1.0, 0.99, 2).active and not Dry(1.0, 2.0, 2, last_n=0).active and not Dry(0.0, 2.0, 2).active
    assert Dry(1.0, 2.0, 2, last_n=1).active and Dry(1.0, 1.0, 2).active
    a, b, c = range(3)
    assert penalty_of(Dry(0.5, 1.0, 2), [a, b, c, a, b, c, a, b], 3).tolist() == [0.0, 0.0, 0.5]


def test_the_window_counts_only_the_last_tokens():
    a, b, c = range(3)
    assert penalty_of(Dry(1.0, 2.0, 2, last_n=5), [a, b, c, c, c, a, b], 3).tolist() == [0.0, 0.0, 0.0]
    assert penalty_of(Dry(1.0, 2.0, 2, last_n=7), [a, b, c, c, c, a, b], 3).tolist() == [0.0, 0.0, 1.0]


def test_a_huge_repeat_is_capped_before_the_power_overflows():
    penalty = penalty_of(Dry(1.0, 1.75, 0), [0] * 400, 2)
    assert torch.isfinite(penalty).all() and penalty[0] > 1e37


@pytest.fixture(scope="module")
def words() -> PreTrainedTokenizerFast:
    vocab = {word: index for index, word in enumerate(["<unk>", "x", "a", "b", "xa", "ab", "c", "c:"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


def test_breakers_are_found_as_llama_cpp_finds_them_in_the_words(words):
    """A word holding the breaker is one alone; a word ending in its start leads the rest's tokens."""
    assert set(restart_sequences(words, ("ab",))) == {(5, ()), (4, (3,)), (2, (3,))}
    assert set(restart_sequences(words, (":",))) == {(7, ())}
    assert dry_of(0.0, 1.75, 2, -1, words) is None  # off: nothing tokenized
    assert dry_of(0.8, 1.75, 2, -1, words, (":",)).restarts == ((7, ()),)


def test_a_long_breaker_is_cut_at_40_characters_and_its_tail_at_20_tokens(words):
    """llama.cpp's bounds: ":" and then 30 " x" is read as its first 40 characters, so "c:" leads
    19 x's; ":" and then 30 "x:" (one-character tokens, ":" unknown) leads its first 20 tokens."""
    assert restart_sequences(words, (":" + " x" * 30,)) == ((7, (1,) * 19),)
    assert restart_sequences(words, (":" + "x:" * 30,)) == ((7, (1, 0) * 10),)


def test_a_breakers_tail_is_tokenized_without_the_tokenizers_bos():
    """A Llama-style tokenizer adds <s> to what it encodes unless told not to; a breaker's tail is
    the text's own tokens."""
    vocab = {"<unk>": 0, "x": 1, "a": 2, "b": 3, "xa": 4, "ab": 5, "<s>": 6}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 6)])
    llama_like = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>")
    assert llama_like.encode("b") == [6, 3]
    assert set(restart_sequences(llama_like, ("ab",))) == {(5, ()), (4, (3,)), (2, (3,))}


def test_specexec_under_dry_emits_autoregressive_decodings_tokens(tiny_target, tiny_draft):
    dry = Dry(1.5, 1.75, 1, restarts=((3, ()),))
    for sampling in (GREEDY, SamplingParams(0.8, 0.95, seed=3)):
        def under_dry() -> SamplingParams:
            return counted_from(sampling, Penalties(dry=dry), [5, 6, 7, 8])

        reference, _ = run(AutoregressiveEngine(tiny_target, []), under_dry(), prompt=[5, 6, 7, 8])
        engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=16, max_depth=6))
        assert run(engine, under_dry(), prompt=[5, 6, 7, 8])[0] == reference
        assert reference != run(AutoregressiveEngine(tiny_target, []), sampling, prompt=[5, 6, 7, 8])[0]
