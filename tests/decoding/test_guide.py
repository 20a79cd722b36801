"""Constrained decoding (decoding/guide.py) on the tiny random pair: a tokenizer of single
characters, so that a JSON schema's grammar decides every token. Every emitted token is one the
grammar allowed, the draft's tree grows only through allowed tokens, and SpecExec emits exactly
what constrained autoregressive decoding emits, greedy and seeded."""

import json
import re
from dataclasses import replace

import llguidance
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import SamplingParams
from specchat.decoding.guide import Grammars, unpack
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC, catch_up, grow
from specchat.decoding.specinfer import SPECINFER
from specchat.decoding.token_log import TokenLog
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError

# the tiny models' 50 ids: 0 unknown, 1 the end of a reply, then characters
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789{}[],:\" -._\n"
STOP = 1
BYTE_LEVEL = {" ": "Ġ", "\n": "Ċ"}
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "tag": {"type": "string", "maxLength": 6}},
          "required": ["id", "tag"], "additionalProperties": False}
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def characters() -> PreTrainedTokenizerFast:
    # byte-level words (GPT-2's alphabet: a space is "Ġ", a newline "Ċ"), as llguidance reads them
    vocab = {"<unk>": 0, "</s>": STOP} | {BYTE_LEVEL.get(c, c): i + 2 for i, c in enumerate(CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                                                       pre_tokenizers.Split("", behavior="isolated")])
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="</s>")


@pytest.fixture(scope="module")
def grammars(characters) -> Grammars:
    return Grammars(characters, 50, {STOP})


def text_of(ids: list[int]) -> str:
    return "".join(CHARACTERS[i - 2] for i in ids if i != STOP)


def allowed_text(allowed: torch.Tensor) -> str:
    return "".join(sorted(text_of(allowed.nonzero().flatten().tolist()), key=CHARACTERS.index))


def test_the_mask_allows_what_the_grammar_allows_and_paths_leave_the_state_as_it_was(grammars):
    guide = grammars.json_schema(SCHEMA).start()
    first = guide.allowed()[0]
    assert allowed_text(first) == "{"
    brace, quote = 2 + CHARACTERS.index("{"), 2 + CHARACTERS.index('"')
    after = guide.allowed([[brace], [brace, quote]])
    assert allowed_text(after[0]) == '" \n'  # a key comes next, or whitespace
    assert allowed_text(after[1]) == "i"  # the properties in the schema's order: "id" first
    assert torch.equal(guide.allowed()[0], first)  # both paths were rolled back
    assert not guide.allowed([[2 + CHARACTERS.index("a")]]).any()  # a path the grammar forbids: nothing after it
    assert torch.equal(guide.allowed()[0], first)  # and the guide is not left in error


def test_padding_rows_past_the_tokenizers_words_are_in_the_mask_and_never_allowed(characters):
    """Padding rows (Qwen2.5: 151,936 rows, 151,665 words): the mask is the model's width, and the
    rows no word names are never allowed, neither at the start nor where any character may come."""
    guide = Grammars(characters, 100, {STOP}).lark('start: /[a-z]+/').start()
    allowed = guide.allowed([[], [2 + CHARACTERS.index("a")]])
    assert allowed.shape == (2, 100)
    assert allowed_text(allowed[0]) == CHARACTERS[:26] and not allowed[:, 50:].any()


def test_a_schema_the_grammar_engine_refuses_is_one_line(grammars):
    with pytest.raises(SpecchatError, match="^the JSON schema cannot be compiled: ") as refused:
        grammars.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
    assert "\n" not in str(refused.value)


def test_the_draft_tree_grows_only_through_allowed_tokens(tiny_draft, grammars):
    guide = grammars.json_schema(SCHEMA).start()
    brace = 2 + CHARACTERS.index("{")
    guide.accept(brace)  # the reply so far: "{"
    cache = new_cache()
    grown = grow(tiny_draft, cache, catch_up(tiny_draft, cache, torch.tensor(PROMPT + [brace]), 0),
                 TreeShape(budget=24, max_depth=4), SamplingParams(temperature=1.0, guide=guide))
    tree = grown.tree
    assert tree.size == 24
    for node in range(1, tree.tokens.numel()):
        path, at = [], node
        while at > 0:
            path.append(int(tree.tokens[at]))
            at = int(tree.parents[at])
        assert reference_allows(grammars, [brace] + path[::-1]), text_of(path[::-1])


def reference_allows(grammars: Grammars, tokens: list[int]) -> bool:
    """llguidance's own matcher, fresh, takes `tokens` one by one."""
    matcher = llguidance.LLMatcher(grammars.tokenizer, grammars.json_schema(SCHEMA).text)
    return all(matcher.consume_token(t) for t in tokens)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0, top_p=1.0),
                                      SamplingParams(temperature=1.0, top_p=0.95, seed=7),
                                      SamplingParams(temperature=0.6, top_p=0.9, seed=3)])
@pytest.mark.parametrize("budget", [4, 32])
def test_specexec_under_a_grammar_emits_constrained_autoregressive_decoding(tiny_target, tiny_draft, grammars,
                                                                             sampling, budget):
    grammar = grammars.json_schema(SCHEMA)

    def reply(engine) -> list[int]:
        events = engine.generate(PROMPT, 40, replace(sampling, guide=grammar.start()))
        return [t for e in events for t in e.token_ids]

    reference = reply(AutoregressiveEngine(tiny_target, {STOP}))
    tokens = reply(TreeEngine(SPECEXEC, tiny_target, tiny_draft, {STOP}, TreeShape(budget=budget, max_depth=6)))
    assert tokens == reference
    assert reference_allows(grammars, reference)
    if reference[-1] == STOP:  # finished: a whole document of the schema
        document = json.loads(text_of(reference))
        assert set(document) == {"id", "tag"} and isinstance(document["id"], int)


# llama.cpp's GBNF: a list of ids, each a letter then one to three digits
GBNF = '''root ::= "[" item ("," item)* "]"
item ::= [a-z] [0-9]{1,3}
'''
LARK = '''start: "[" item ("," item)* "]"
item: /[a-z][0-9]{1,3}/
'''


@pytest.mark.parametrize("text", [GBNF, LARK], ids=["gbnf", "lark"])
def test_a_grammar_in_gbnf_or_lark_allows_its_language_and_specexec_keeps_it(tiny_target, tiny_draft, grammars, text):
    grammar = grammars.grammar(text)
    guide = grammar.start()
    assert allowed_text(guide.allowed([[]])[0]) == "["
    guide.accept(CHARACTERS.index("[") + 2)
    assert allowed_text(guide.allowed([[]])[0]) == "abcdefghijklmnopqrstuvwxyz"
    sampling = SamplingParams(temperature=1.0, top_p=1.0, seed=4)

    def reply(engine) -> list[int]:
        return [t for e in engine.generate(PROMPT, 30, replace(sampling, guide=grammar.start())) for t in e.token_ids]

    reference = reply(AutoregressiveEngine(tiny_target, {STOP}))
    assert reply(TreeEngine(SPECEXEC, tiny_target, tiny_draft, {STOP}, TreeShape(budget=16, max_depth=6))) == reference
    language = r"\[([a-z][0-9]{1,3},)*[a-z][0-9]{1,3}\]" if reference[-1] == STOP else \
        r"\[([a-z][0-9]{1,3},)*([a-z][0-9]{0,3})?"  # a whole list where it ended, else a list's beginning
    assert re.fullmatch(language, text_of(reference)), text_of(reference)


@pytest.mark.parametrize(("text", "fragment"), [('root ::= item\n', "Rule 'item' not found"),
                                                ('root ::= "open\n', "Unexpected end of input"),
                                                ("start: nowhere\n", "the grammar cannot be compiled")])
def test_a_grammar_that_cannot_compile_is_one_line(grammars, text, fragment):
    with pytest.raises(SpecchatError, match="the grammar cannot be compiled") as raised:
        grammars.grammar(text)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


def test_engines_that_cannot_keep_a_grammar_say_so(tiny_target, tiny_draft, grammars):
    engine = TreeEngine(SPECINFER, tiny_target, tiny_draft, {STOP}, TreeShape(budget=4))
    with pytest.raises(SpecchatError, match="--engine specinfer cannot keep a reply to a grammar, log"):
        list(engine.generate(PROMPT, 4, SamplingParams(guide=grammars.json_schema(SCHEMA).start())))


@pytest.mark.parametrize("strategy, keeps", [(SPECEXEC, True), (SPECINFER, False), (CHAIN_SD, False), (None, True)],
                         ids=["specexec", "specinfer", "sd", "autoregressive"])
def test_keeps_forms_says_whether_an_engine_fills_a_token_log(tiny_target, tiny_draft, strategy, keeps):
    """What the server reads to refuse logprobs and grammars up front (serve/endpoint.py). The
    sampling engines (SpecInfer, chain SD) accept a draft's token with probability min(1, p/q): a
    grammar or a log would need the draft's q masked alike, which they do not do."""
    engine = (AutoregressiveEngine(tiny_target, {STOP}) if strategy is None
              else TreeEngine(strategy, tiny_target, tiny_draft, {STOP}, TreeShape(budget=4)))
    assert engine.keeps_forms == keeps
    log = TokenLog()
    if not engine.keeps_forms:
        with pytest.raises(SpecchatError, match="cannot keep a reply to a grammar, log"):
            list(engine.generate(PROMPT, 4, SamplingParams(0.0, token_log=log)))
        return
    tokens = [t for e in engine.generate(PROMPT, 4, SamplingParams(0.0, token_log=log)) for t in e.token_ids]
    assert [entry.token for entry in log.entries] == tokens and tokens


def test_after_a_whole_document_only_the_end_follows_and_nothing_after_it(grammars):
    """A grammar that cannot be extended stops at its last character: the end token is allowed,
    a tree node past the end allows nothing, and emitting the end leaves the guide whole (a
    drafted end token was once expanded, and the matcher refused the path in error)."""
    guide = grammars.json_schema({"type": "object", "properties": {}, "additionalProperties": False}).start()
    for character in "{}":
        guide.accept(2 + CHARACTERS.index(character))
    assert guide.allowed()[0].nonzero().flatten().tolist() == [STOP]
    assert not guide.allowed([[STOP]]).any() and not guide.allowed([[STOP, 5]]).any()
    guide.accept(STOP)
    assert not guide.matcher.is_error()


def test_accepting_a_token_the_mask_forbids_is_a_bug_said_in_one_line_and_not_passed_over(grammars):
    guide = grammars.json_schema(SCHEMA).start()
    with pytest.raises(ValueError, match="^token 2 is not allowed here"):
        guide.accept(2)  # "a": a JSON object opens with "{"


def test_the_bitmask_unpacks_token_by_token_as_its_words_bits():
    """Token 32 w + b is allowed iff bit b of int32 word w is set: checked against each bit read
    with Python's integers, for words with the sign bit set too."""
    words = torch.tensor([[0, -1, 1, -2**31], [2**31 - 1, 5, -6, 0x40000000]], dtype=torch.int32)
    expected = [[bool((int(word) & 0xFFFFFFFF) >> bit & 1) for word in row for bit in range(32)] for row in words]
    assert unpack(words).tolist() == expected
