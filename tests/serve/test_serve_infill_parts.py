"""The parts of /infill on their own: the editor stops over text arriving in pieces (a fake
clock for the time limit), the layout's encoding and cuts on a real byte-level tokenizer with
special tokens, and which fill-in-the-middle family a tokenizer holds."""

import pytest
from helpers.cli import train_tokenizer

from specchat.serve.fim import FAMILIES, fim_tokens
from specchat.serve.native_stops import LineCut
from specchat.serve.infill_request import BATCH, PREFIX_TAKE, InfillLayout, InfillRequest

SPECIALS = ["<P>", "<S>", "<M>", "<R>", "<F>"]
FIM = FAMILIES[0].__class__(*SPECIALS)


def kept(cut: LineCut, pieces: list[str]) -> str:
    return "".join(cut.push(piece) for piece in pieces)


@pytest.mark.parametrize(("pieces", "expected"), [
    (["ret", "urn 1\n    x", " = 2\n  y = 3\n"], "return 1\n    x = 2\n  "),  # judged across pieces
    (["a\n", "    ", "    b\n", "c"], "a\n        b\n"),  # a line of blanks waits for its first character
    (["a\n    b\n\n    c\n"], "a\n    b\n"),  # an empty line is indent 0, as in llama.cpp
    (["  first line is never judged\n    ok\n"], "  first line is never judged\n    ok\n"),
    (["\nx = 1\n"], "\n"),  # a reply that opens with a new line: its first line is empty
    (["a\n   b\n"], "a\n   "),  # every blank counted: three are less than four
])
def test_the_indent_stop_cuts_before_the_first_line_indented_less(pieces, expected):
    cut = LineCut(n_indent=4, t_max_s=0)
    assert kept(cut, pieces) == expected
    assert cut.hit == (expected != "".join(pieces))
    assert cut.through == (len(expected) + 1 if cut.hit else 0)  # the line's first character decided it


def test_an_indent_of_one_ends_the_reply_at_a_line_with_none_and_a_tab_is_indent():
    assert kept(LineCut(n_indent=1, t_max_s=0), ["if x:\n\ty\n", "z\n"]) == "if x:\n\ty\n"


def test_past_the_time_limit_the_reply_ends_at_the_next_new_line():
    now = iter([100.0, 100.5, 101.0, 102.0, 102.1])
    cut = LineCut(n_indent=0, t_max_s=1.0, clock=lambda: next(now))
    assert cut.push("a = 1\nb") == "a = 1\nb"  # the first text starts the clock
    assert cut.push(" = 2\nc") == " = 2\nc"  # 0.5 s: within the limit
    assert cut.push("\nc") == "\nc"  # 1.0 s: at the limit, not past it
    assert cut.push(" = 3 and more") == " = 3 and more" and not cut.hit  # 2.0 s, but no new line yet
    assert cut.push("\nd = 4\n") == "\n" and cut.hit and cut.through == len(cut.text)  # the new line, kept
    assert cut.push("e") == ""


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = train_tokenizer(["def f(x):\n    return x + 1\n", "print(f(2))\n", "x = 1\n"] * 10)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    return tokenizer


def test_special_token_names_typed_in_the_code_stay_text(tokenizer):
    request = InfillRequest(input_prefix="s = '<P>'\n", input_suffix="<M>")
    ids, truncated = InfillLayout(tokenizer, FIM).ids(request, context=32768, wanted=16)
    specials = {tokenizer.convert_tokens_to_ids(name): name for name in SPECIALS}
    assert [specials[token] for token in ids if token in specials] == ["<R>", "<F>", "<P>", "<S>", "<M>"]
    assert tokenizer.decode(ids) == "<R>myproject\n<F>filename\n<P>s = '<P>'\n<S><M><M>" and not truncated


def test_what_does_not_fit_is_cut_as_llama_cpp_cuts_it(tokenizer):
    layout = InfillLayout(tokenizer, FIM)
    long = "x = 1\n" * 2000
    request = InfillRequest(input_prefix=long + "tail", input_suffix="head" + long, prompt="ab",
                            input_extra=[{"text": "old\n" + long}, {"text": "new\n"}])
    ids, truncated = layout.ids(request, context=BATCH + 64, wanted=16)
    at = {name: ids.index(tokenizer.convert_tokens_to_ids(name)) for name in ("<P>", "<S>", "<M>")}
    prompt = layout.text("ab")
    prefix, suffix = ids[at["<P>"] + 1:at["<S>"] - len(prompt)], ids[at["<S>"] + 1:at["<M>"]]
    assert truncated and ids[at["<S>"] - len(prompt):at["<S>"]] == prompt
    assert prefix == layout.text(long + "tail")[-PREFIX_TAKE:]  # its last 3/4 of a batch
    assert suffix == layout.text("head" + long)[:BATCH // 4 - 2 - len(prompt)]  # its first quarter, less the prompt
    extra = tokenizer.decode(ids[:at["<P>"]])
    assert extra.endswith("new\n<F>filename\n") and "old" not in extra  # the oldest context went first
    assert len(ids) <= BATCH + 64 - 16 and len(ids) + 16 > BATCH + 64 - 2 * 16  # llama.cpp's room: twice the reply


@pytest.mark.parametrize(("added", "family"), [
    (["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"], 0),
    (["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"], 1),
    (["<fim_prefix>", "<fim_suffix>", "<fim_middle>"], 2),  # StarCoder: no repository tokens
    (["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"], 3),  # DeepSeek-Coder
    (["<fim_prefix>", "<fim_middle>"], None),
])
def test_the_family_is_the_first_whose_tokens_the_tokenizer_holds(added, family):
    tokenizer = train_tokenizer(["a b c"] * 5)
    tokenizer.add_special_tokens({"additional_special_tokens": added})
    assert fim_tokens(tokenizer) == (None if family is None else FAMILIES[family])


def test_a_fill_in_the_middle_prompt_is_prefix_suffix_middle():
    assert FAMILIES[0].prompt("def f(", "):\n") == "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>"
