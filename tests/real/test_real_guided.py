"""Constrained decoding on the real embedded pair in float32 (issue 51): under a JSON schema and
under a tool call's grammar, SpecExec (greedy under the one, seeded under the other) emits
exactly what constrained autoregressive decoding emits, written independently
(tests/helpers/reference_loop.py: transformers' forward and warpers) and masked by llguidance's
own matcher, fed token by token apart from the project's guide. The replies that end parse, and
validate against the schema. Under a grammar in llama.cpp's GBNF, greedy SpecExec equals the
project's constrained autoregressive engine. (That engine under a guide against SpecExec:
tests/decoding/test_guide.py, on the tiny pair.)"""

import json
import re

import llguidance
import llguidance.hf
import pytest
import torch
from helpers.real_pair import PAPER_SAMPLING
from helpers.reference_loop import reference_decode

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.guide import Grammars
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.serve.structured import call_grammar, split_calls

pytestmark = pytest.mark.real

NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, top_p=1.0)
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "born": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["name", "born", "languages"], "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "The weather in a city now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
PERSON_PROMPT = "Describe Guido van Rossum as JSON: his name, the year he was born and the languages he created."
WEATHER_PROMPT = "What is the weather in Paris in celsius?"


class MatcherMask:
    """llguidance's own matcher, fed the reply's tokens as they come: the allowed tokens after them,
    bool [V], read from its byte-per-token mask (the guide reads the bit-per-token one)."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str) -> None:
        self.matcher = llguidance.LLMatcher(tokenizer, grammar)
        self.fed = 0

    def __call__(self, new: list[int]) -> torch.Tensor:
        assert self.matcher.consume_tokens(new[self.fed:]), self.matcher.get_error()
        self.fed = len(new)
        return torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8) > 0


@pytest.fixture(scope="module")
def grammars(real_pair) -> Grammars:
    return Grammars(real_pair.tokenizer, real_pair.target.model.config.vocab_size, real_pair.stop_ids)


def form(grammars: Grammars, kind: str):
    if kind == "schema":
        return grammars.json_schema(PERSON), PERSON_PROMPT, []
    tools = [{"type": "function", "function": WEATHER}]
    return grammars.lark(call_grammar([WEATHER])), WEATHER_PROMPT, tools


# Each grammar and each mode once: the schema greedy, a tool call's grammar (its forced special
# tokens, its free arguments) seeded. A grammar masks the logits before either mode reads them
# (decoding/guide.py); greedy and two samplings run under a schema on the tiny pair (test_guide.py).
@pytest.mark.parametrize(("sampling", "kind"), [(GREEDY, "schema"), (PAPER_SAMPLING, "tool")],
                         ids=["greedy-schema", "seeded-tool"])
def test_specexec_under_a_grammar_equals_constrained_decoding_and_the_independent_loop(real_pair, grammars, kind,
                                                                                       sampling):
    grammar, prompt, tools = form(grammars, kind)
    prompt_ids = real_pair.chat_with_tools(prompt, tools)
    vocab = real_pair.target.model.config.vocab_size
    independent = llguidance.hf.from_tokenizer(real_pair.tokenizer, n_vocab=vocab, eos_token=sorted(real_pair.stop_ids))
    reference = reference_decode(real_pair.target.model, prompt_ids, NEW_TOKENS, sampling.temperature, sampling.top_p,
                                 sampling.seed, real_pair.stop_ids, use_cache=True,
                                 allowed=MatcherMask(independent, grammar.text))
    specexec = TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=16))
    events = list(specexec.generate(prompt_ids, NEW_TOKENS, SamplingParams(
        sampling.temperature, sampling.top_p, sampling.seed, guide=grammar.start())))
    tokens = [t for e in events for t in e.token_ids]
    assert tokens == reference
    assert sum(e.accepted for e in events) > 0  # the draft's constrained trees were accepted
    text = real_pair.tokenizer.decode(tokens, skip_special_tokens=True)
    if tokens[-1] in real_pair.stop_ids:
        assert_valid(kind, text)


def assert_valid(kind: str, text: str) -> None:
    if kind == "schema":
        document = json.loads(text)
        assert set(document) == {"name", "born", "languages"} and isinstance(document["born"], int)
        assert all(isinstance(language, str) for language in document["languages"])
    else:
        content, calls = split_calls(text)
        assert content is None and [call["function"]["name"] for call in calls] == ["get_weather"]
        arguments = json.loads(calls[0]["function"]["arguments"])
        assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")


ANSWER_GBNF = '''root ::= answer ", because " reason "."
answer ::= "Yes" | "No"
reason ::= [a-z ]{1,60}
'''


def test_specexec_under_a_gbnf_grammar_equals_constrained_autoregressive_decoding(real_pair, grammars):
    """llama.cpp's GBNF, as `--grammar`, `/grammar` and a request's `grammar` take it, over the real
    vocabulary: greedy SpecExec equals the project's constrained autoregressive decoding (the
    independent loop judges the guide itself above), and the reply is in the grammar's language."""
    grammar = grammars.grammar(ANSWER_GBNF)
    prompt_ids = real_pair.chat("Is Python dynamically typed? Answer yes or no, then say why in a few words.")

    def reply(engine) -> tuple[list[int], list]:
        events = list(engine.generate(prompt_ids, 16, SamplingParams(0.0, 1.0, guide=grammar.start())))
        return [t for e in events for t in e.token_ids], events

    reference, _ = reply(AutoregressiveEngine(real_pair.target, real_pair.stop_ids))
    tokens, events = reply(TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids,
                                      TreeShape(budget=16)))
    assert tokens == reference and sum(e.accepted for e in events) > 0
    text = real_pair.tokenizer.decode(tokens, skip_special_tokens=True)
    assert re.fullmatch(r"(Yes|No), because [a-z ]{1,60}\.?", text), text
