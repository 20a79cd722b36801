"""A reply's token accounting (serve/reply.py): the logprobs sent are those of the tokens whose text
was sent, and usage counts the tokens up to the one that completed a stop string, however many
tokens past it a tree accepted in the same iteration."""

import pytest
from helpers.cli import train_tokenizer

from specchat.decoding.events import IterationEvent
from specchat.decoding.token_log import TokenLog, TokenLogprobs
from specchat.serve.reply import Reply
from specchat.serve.stops import StopScan
from specchat.serve.text_reply import logprob_per_token
from specchat.textstream import TextStream


class PieceTokenizer:
    """Token t is PIECES[t]: tokens of several characters, so a stop string may begin or end
    inside one."""

    PIECES = ["he", "llo", " wor", "ld", "!", "XY", "X", "Y"]

    def encode(self, pieces: list[str]) -> list[int]:
        return [self.PIECES.index(piece) for piece in pieces]

    def decode(self, token_ids, skip_special_tokens=True):
        return "".join(self.PIECES[token] for token in token_ids)


def event(token_ids: list[int]) -> IterationEvent:
    return IterationEvent(token_ids=token_ids, accepted=len(token_ids) - 1, tree_size=8, depth=4, draft_s=0.0,
                          target_s=0.0)


def logged_reply(tokenizer, stops: list[str], stop_ids=frozenset()) -> Reply:
    return Reply(TextStream(tokenizer), StopScan(stops), stop_ids, token_log=TokenLog())


def push_logged(reply: Reply, token_ids: list[int]) -> str:
    """One iteration's tokens, logged first as the decoding thread logs them (each its own logprob)."""
    reply.token_log.entries.extend(TokenLogprobs(token, -float(token), ()) for token in token_ids)
    return reply.push(event(token_ids))


def logged_tokens(reply: Reply) -> list[int]:
    return [entry.token for entry in reply.take_logged()]


def test_tokens_a_tree_accepted_past_a_stop_string_are_neither_logged_nor_counted():
    tokenizer = PieceTokenizer()
    reply = logged_reply(tokenizer, ["o w"])
    ids = tokenizer.encode(["he", "llo", " wor", "ld", "!"])  # one iteration: the stop, then two tokens more
    assert push_logged(reply, ids) + reply.finish() == "hell"
    assert logged_tokens(reply) == ids[:2]  # "llo" holds sent text; " wor" begins inside the stop
    assert reply.completion_tokens == 3  # through " wor", which completed the stop
    assert reply.finish_reason() == "stop"


def test_a_token_held_back_as_a_stop_strings_possible_start_is_logged_once_sent():
    tokenizer = PieceTokenizer()
    reply = logged_reply(tokenizer, ["XY"])
    assert push_logged(reply, tokenizer.encode(["he", "X"])) == "he"
    assert logged_tokens(reply) == tokenizer.encode(["he"]) and not reply.unsent_logprobs
    assert push_logged(reply, tokenizer.encode(["llo"])) == "Xllo"
    assert reply.unsent_logprobs and logged_tokens(reply) == tokenizer.encode(["X", "llo"])
    assert reply.completion_tokens == 3


def test_a_stop_string_that_is_one_token_counts_that_token_and_logs_none_of_it():
    tokenizer = PieceTokenizer()
    reply = logged_reply(tokenizer, ["XY"])
    assert push_logged(reply, tokenizer.encode(["he", "XY", "llo"])) == "he"
    assert logged_tokens(reply) == tokenizer.encode(["he"]) and reply.completion_tokens == 2


@pytest.fixture(scope="module")
def byte_level():
    return train_tokenizer(["hello there, hello world", "the quick brown fox"])


def test_the_end_token_is_counted_but_has_no_logprobs_entry(byte_level):
    """OpenAI's logprobs cover the reply's text; the model's end token has none (it is skipped)."""
    reply = logged_reply(byte_level, [], stop_ids=frozenset({byte_level.eos_token_id}))
    ids = byte_level.encode("hello world", add_special_tokens=False)
    push_logged(reply, [*ids, byte_level.eos_token_id])
    assert reply.finish() == ""
    assert logged_tokens(reply) == ids
    assert reply.completion_tokens == len(ids) + 1 and reply.finish_reason() == "stop"


def test_best_of_ranks_a_reply_by_the_mean_logprob_of_the_tokens_its_usage_counts(byte_level):
    """Each token t logged at -t: the mean runs over the tokens through the one that completed a
    stop string (not those a tree accepted past it), and over the end token, which logs no entry
    but is the model's choice to end."""
    pieces = PieceTokenizer()
    stopped = logged_reply(pieces, ["o w"])
    push_logged(stopped, pieces.encode(["he", "llo", " wor", "ld", "!"]))
    assert logprob_per_token(stopped) == pytest.approx(-(0 + 1 + 2) / 3)
    ended = logged_reply(byte_level, [], stop_ids=frozenset({byte_level.eos_token_id}))
    ids = [*byte_level.encode("hello world", add_special_tokens=False), byte_level.eos_token_id]
    push_logged(ended, ids)
    ended.finish()
    assert logprob_per_token(ended) == pytest.approx(-sum(ids) / len(ids))
    assert logprob_per_token(logged_reply(pieces, [])) == -float("inf")  # nothing decoded: below any other


def test_a_characters_byte_tokens_are_logged_once_the_character_is_sent(byte_level):
    snowman = byte_level.encode("☃", add_special_tokens=False)  # unseen in training: three byte tokens
    assert len(snowman) == 3
    reply = logged_reply(byte_level, [])
    assert push_logged(reply, snowman[:2]) == ""
    assert logged_tokens(reply) == [] and not reply.unsent_logprobs
    assert push_logged(reply, snowman[2:]) == "☃"
    assert logged_tokens(reply) == snowman



def test_a_front_ends_cut_counts_logprobs_to_the_text_kept_and_usage_to_what_decided_it():
    """llama.cpp's editor stops (serve/native_stops.py) end a reply on its text: as a stop string."""
    tokenizer = PieceTokenizer()
    reply = logged_reply(tokenizer, [])
    ids = tokenizer.encode(["he", "llo", " wor", "ld", "!"])
    assert push_logged(reply, ids) == "hello world!"
    reply.cut(5, 7)  # "hello" kept, decided by the "w" of " wor"
    assert logged_tokens(reply) == ids[:2] and reply.completion_tokens == 3
