"""A reply (serve/reply.py): the logprobs sent are those of the tokens whose text was sent, usage
counts the tokens up to the one that completed a stop string, however many tokens past it a tree
accepted in the same iteration; and the OpenAI objects made of it (the completion, its chunks,
usage summed over choices, the logprobs, the `specchat` figures), compared whole."""

import time

import pytest
from helpers.cli import train_tokenizer
from helpers.serve_helpers import loop  # noqa: F401 (a fixture)

from specchat.decoding.events import IterationEvent, SamplingParams
from specchat.decoding.prediction import Prediction
from specchat.decoding.token_log import TokenLog, TokenLogprobs
from specchat.serve.reply import (Chunks, Reply, chat_choice, completion, extension, figures, summed_usage,
                                  usage)
from specchat.serve.scheduler import Job
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


def event(token_ids: list[int], prefill: int = 0) -> IterationEvent:
    """An iteration's tokens and figures; the first of a reply computes `prefill` prompt tokens."""
    return IterationEvent(token_ids=token_ids, accepted=len(token_ids) - 1, tree_size=8, depth=4, draft_s=0.25,
                          target_s=0.5, transfer_s=0.125, prefill_tokens=prefill, prefill_s=0.75 if prefill else 0.0)


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


def job_of(loop, prompt_ids: list[int], arrived: int = 1, started: int = 1) -> Job:
    """A job that waited 1.5 s and decoded for 2 s."""
    return Job(prompt_ids, 16, SamplingParams(seed=7), loop, arrived=arrived, started=started,
               enqueued_s=10.0, started_s=11.5, ended_s=13.5, engine="specexec")


def reply_with(tokenizer, *events: IterationEvent, may_call: bool = False) -> Reply:
    reply = Reply(TextStream(tokenizer), StopScan([]), frozenset({4}), may_call=may_call)  # "!" ends the reply
    for each in events:
        reply.push(each)
    reply.finish()
    return reply


def test_a_reply_with_no_event_reports_no_cached_prompt_tokens():
    assert usage(5, reply_with(PieceTokenizer())) == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}


def test_usage_reports_cached_prompt_tokens_once_the_engine_reports_its_prefill():
    tokenizer = PieceTokenizer()
    assert usage(10, reply_with(tokenizer, event([0, 1]))) == {"prompt_tokens": 10, "completion_tokens": 2,
                                                              "total_tokens": 12}
    assert usage(10, reply_with(tokenizer, event([0], prefill=3)))["prompt_tokens_details"] == {"cached_tokens": 7}


def test_the_finish_reason_is_stop_at_a_stop_token_else_length():
    tokenizer = PieceTokenizer()
    assert reply_with(tokenizer, event([0, 4])).finish_reason() == "stop"
    assert reply_with(tokenizer, event([0, 1])).finish_reason() == "length"


def test_summed_usage_counts_each_prompt_once_however_many_choices_it_has(loop):
    """Two prompts of 3 and 5 tokens, each reply its own: a batch adds both prompts (per_prompt 1)."""
    tokenizer = PieceTokenizer()
    replies = [(job_of(loop, [0] * 3), reply_with(tokenizer, event([0, 1], prefill=2))),
               (job_of(loop, [0] * 5), reply_with(tokenizer, event([2], prefill=5)))]
    assert summed_usage(replies) == {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11,
                                     "prompt_tokens_details": {"cached_tokens": 1}}
    assert summed_usage(replies, per_prompt=2) == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                                                   "prompt_tokens_details": {"cached_tokens": 1}}


def test_the_specchat_figures_say_how_a_reply_was_decoded_and_how_long_it_waited(loop):
    reply = reply_with(PieceTokenizer(), event([0], prefill=6), event([1, 2, 3]))
    assert extension(job_of(loop, [0] * 6, arrived=3, started=2), reply) == {
        "engine": "specexec", "iterations": 2, "gen_rate": 2.0, "accepted_per_iteration": 1.0, "tree_size": 8.0,
        "draft_s": 0.5, "target_s": 1.0, "transfer_s": 0.25, "tokens_per_s": 2.0, "prefill_tokens": 6,
        "prefill_s": 0.75, "seed": 7, "queue_s": 1.5, "arrived": 3, "started": 2}
    never_started = extension(job_of(loop, [0], started=0), reply)
    assert never_started["queue_s"] == never_started["tokens_per_s"] == 0.0
    nothing_decoded = extension(job_of(loop, [0]), reply_with(PieceTokenizer()))
    assert nothing_decoded["prefill_tokens"] == 0 and nothing_decoded["prefill_s"] == 0.0


def test_usage_counts_the_predicted_tokens_the_reply_followed_and_those_it_did_not(loop):
    """OpenAI's accepted_prediction_tokens are at most the reply's tokens (a tree may follow the
    prediction past a stop); the rejected are the rest of the prediction."""
    tokenizer = PieceTokenizer()
    replies = []
    for followed in (4, 1):
        reply = reply_with(tokenizer, event([0, 1, 2]))
        reply.prediction = Prediction(tokens=(0, 1, 2, 3, 5, 6), accepted=followed)
        replies.append((job_of(loop, [0]), reply))
    assert usage(1, replies[0][1])["completion_tokens_details"] == {"accepted_prediction_tokens": 3,
                                                                    "rejected_prediction_tokens": 3}
    assert summed_usage(replies)["completion_tokens_details"] == {"accepted_prediction_tokens": 4,
                                                                  "rejected_prediction_tokens": 8}
    assert "completion_tokens_details" not in usage(1, reply_with(tokenizer, event([0])))


def test_a_completion_holds_a_choice_a_reply_with_the_prompts_tokens_counted_once(loop):
    tokenizer = PieceTokenizer()
    replies = [(job_of(loop, [0] * 4), reply_with(tokenizer, event([0, 1, 4]))),
               (job_of(loop, [0] * 4), reply_with(tokenizer, event([2, 3])))]
    before = int(time.time())
    answer = completion("m", ["hello", " world"], replies)
    assert before <= answer.pop("created") <= int(time.time())
    assert answer.pop("id").startswith("chatcmpl-") and answer.pop("specchat") == figures(replies)
    assert answer == {"object": "chat.completion", "model": "m", "usage": {
        "prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}, "logprobs": None, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": " world"}, "logprobs": None,
         "finish_reason": "length"}]}
    assert completion("m", ["x"], replies[:1])["id"] != completion("m", ["x"], replies[:1])["id"]
    assert isinstance(figures(replies[:1]), dict) and len(figures(replies)) == 2


CALL_TEXT = 'Looking. <tool_call>{"name": "find", "arguments": {"q": 1}}</tool_call>'


def test_tool_call_blocks_are_calls_only_where_the_request_offered_tools():
    tokenizer = PieceTokenizer()
    plain = chat_choice(0, CALL_TEXT, Reply(TextStream(tokenizer), StopScan([]), frozenset()))  # as a test sends
    assert plain["message"] == {"role": "assistant", "content": CALL_TEXT} and plain["finish_reason"] == "length"
    offered = chat_choice(0, CALL_TEXT, reply_with(tokenizer, event([0]), may_call=True))
    assert offered["message"]["content"] == "Looking." and offered["finish_reason"] == "tool_calls"
    [call] = offered["message"]["tool_calls"]
    assert call["function"] == {"name": "find", "arguments": '{"q": 1}'}


def test_a_streamed_replys_chunks_share_its_id_and_time_and_name_their_choice(loop):
    tokenizer = PieceTokenizer()
    job, reply = job_of(loop, [0, 0]), reply_with(tokenizer, event([0, 4]))
    chunks, other = Chunks("m"), Chunks("m")
    assert chunks.id.startswith("chatcmpl-") and chunks.id != other.id
    first = chunks.delta({"content": "he"})
    assert first == {"id": chunks.id, "object": "chat.completion.chunk", "created": chunks.created, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "he"}, "logprobs": None, "finish_reason": None}]}
    calls = chunks.calls([{"id": "a"}, {"id": "b"}], index=2)["choices"]
    assert calls == [{"index": 2, "delta": {"tool_calls": [{"index": 0, "id": "a"}, {"index": 1, "id": "b"}]},
                      "logprobs": None, "finish_reason": None}]
    assert chunks.calls([{"id": "a"}])["choices"][0]["index"] == 0
    last = chunks.last(reply, job)
    assert last["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    assert last["specchat"] == extension(job, reply)
    assert chunks.last(reply, job, called=True, index=1)["choices"] == [
        {"index": 1, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}]
    two_prompts = [(job, reply), (job_of(loop, [0] * 3), reply)]
    assert chunks.summed(two_prompts) == chunks.chunk([], usage=summed_usage(two_prompts))
    assert chunks.summed(two_prompts)["usage"]["prompt_tokens"] == 5


def test_logprobs_are_openais_objects_for_the_tokens_sent_since_the_last_chunk(byte_level):
    """Each entry: the token's text, its logprob, its bytes, and its alternatives described alike."""
    reply = logged_reply(byte_level, [])
    hello, world = (byte_level.encode(word, add_special_tokens=False)[0] for word in ("hello", " world"))
    reply.token_log.entries.append(TokenLogprobs(hello, -0.5, ((hello, -0.5), (world, -2.0))))
    reply.push(event([hello]))
    assert reply.new_logprobs() == {"content": [{
        "token": "hello", "logprob": -0.5, "bytes": list(b"hello"), "top_logprobs": [
            {"token": "hello", "logprob": -0.5, "bytes": list(b"hello")},
            {"token": " world", "logprob": -2.0, "bytes": list(b" world")}]}]}
    assert reply.new_logprobs() == {"content": []}  # nothing sent since
    assert Reply(TextStream(byte_level), StopScan([]), frozenset()).new_logprobs() is None  # not asked for
