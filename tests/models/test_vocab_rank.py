"""The draft head's sub-vocabulary (models/vocab_rank.py): tokens ranked by frequency over chat
replies and code, read up to the corpus's limits, stored once beside the model, the stop tokens
always kept."""

import json

from helpers.tiny import TinyCharTokenizer

from specchat.corpora import sharegpt_records
from specchat.models import vocab_rank
from specchat.models.vocab_rank import RANK_FILE, chat_texts, head_vocab, rank_tokens, stdlib_texts, vocab_ranking


def test_rank_puts_frequent_tokens_first_and_unseen_ones_in_id_order():
    ranking = rank_tokens(TinyCharTokenizer(), ["ccc", "bb", "c"], vocab_size=50)
    assert ranking[:2] == [ord("c") % 50, ord("b") % 50]
    assert sorted(ranking) == list(range(50))
    rest = ranking[2:]
    assert rest == sorted(rest)


def test_rank_counts_each_texts_first_token_and_only_ids_within_the_vocabulary():
    # ids: c 49, d 0 (ord % 50); a text's first token counts as the rest do: d twice, then c once
    assert rank_tokens(TinyCharTokenizer(), ["cdd"], vocab_size=50)[:2] == [0, 49]
    ranking = rank_tokens(TinyCharTokenizer(), ["ccc", "d"], vocab_size=49)  # c's id is the head's size: none
    assert ranking[0] == 0 and sorted(ranking) == list(range(49))


def test_the_ranking_is_stored_once_beside_the_model(tmp_path):
    ranking = vocab_ranking(tmp_path, TinyCharTokenizer(), vocab_size=50)
    assert json.loads((tmp_path / RANK_FILE).read_text()) == ranking
    (tmp_path / RANK_FILE).write_text(json.dumps(list(reversed(ranking))))
    assert vocab_ranking(tmp_path, TinyCharTokenizer(), vocab_size=50) == list(reversed(ranking))


def test_the_corpus_is_chat_replies_then_code():
    chat, code = chat_texts(50_000), stdlib_texts(50_000)
    assert sum(map(len, chat)) >= 50_000 and sum(map(len, code)) >= 50_000
    assert any("def " in text for text in code)
    assert chat[0] == next(turn["value"] for turn in next(sharegpt_records())["conversations"] if turn["from"] == "gpt")


def test_head_vocab_keeps_the_stop_tokens():
    assert head_vocab(list(range(10)), 3, always=[9]).tolist() == [0, 1, 2, 9]


def test_chat_texts_are_the_assistants_turns_up_to_the_limit_or_all_there_are(monkeypatch):
    conversations = [[("human", "q1"), ("gpt", "abcd"), ("gpt", "")], [("gpt", "efg"), ("human", "q2"), ("gpt", "hi")]]
    records = [{"conversations": [{"from": who, "value": value} for who, value in turns]} for turns in conversations]
    monkeypatch.setattr(vocab_rank, "sharegpt_records", lambda: iter(records))
    assert chat_texts(100) == ["abcd", "efg", "hi"]  # every reply, none empty, when the corpus runs out first
    assert chat_texts(4) == ["abcd"]  # the limit reached exactly: no more
    assert chat_texts(5) == ["abcd", "efg"]  # short of it: the next reply too, whole


def test_stdlib_texts_stop_once_the_limit_is_reached():
    first = stdlib_texts(1)[0]  # the first file alone: a limit short of it takes it whole
    assert stdlib_texts(len(first)) == [first]
    assert len(stdlib_texts(len(first) + 1)) == 2
