"""Prefix reuse on the real embedded pair in float32: a 3-turn conversation decoded by one engine
that keeps its caches gives, turn by turn, the tokens a fresh engine gives from a full prefill of
the whole history (greedy and seeded), judged by tests/helpers/exactness.py (design.md section 8), and
each later turn prefills only what follows the reused prefix."""

import pytest
from helpers.engines import GREEDY
from helpers.exactness import ExactnessCheck
from helpers.real_pair import PAPER_SAMPLING

from specchat.bench.datasets import mtbench_questions
from specchat.decoding.prefix import common_prefix
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine

pytestmark = pytest.mark.real

# Per turn: each turn decodes twice (kept caches, then a fresh engine over the whole history),
# and reuse is what is tested, so replies stay short. Autoregressive reuse is tested on the
# tiny models with every other engine (tests/decoding/test_prefix_reuse.py).
NEW_TOKENS = 12


def three_questions() -> list[str]:
    first, second = mtbench_questions()[:2]
    return [*first["turns"], second["turns"][0]]


def reply(engine, prompt_ids, sampling) -> tuple[list[int], list]:
    events = list(engine.generate(prompt_ids, NEW_TOKENS, sampling))
    return [t for e in events for t in e.token_ids], events


def encode(tokenizer, messages) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


@pytest.mark.parametrize("sampling", [GREEDY, PAPER_SAMPLING], ids=["greedy", "seeded"])
def test_three_turns_with_reuse_equal_fresh_prefills(real_pair, sampling):
    real_check = ExactnessCheck(real_pair.target, real_pair.stop_ids, NEW_TOKENS)

    def make():
        return TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=16))

    kept, messages, previous = make(), [], []
    for turn, question in enumerate(three_questions()):
        messages.append({"role": "user", "content": question})
        prompt = encode(real_pair.tokenizer, messages)
        tokens, events = reply(kept, prompt, sampling)
        if turn > 0:  # the first turn's engine has kept nothing yet: it is a fresh engine
            fresh, _ = reply(make(), prompt, sampling)
            comparison = real_check.compare(prompt, fresh, tokens, sampling)
            assert comparison.acceptable, f"turn {turn + 1}: {comparison.describe()}"
        shared = common_prefix(previous, prompt)
        if turn > 0:
            assert shared > len(previous) // 2  # the history is reused, not prefilled again
            assert events[0].prefill_tokens == len(prompt) - min(shared, len(previous) - 1)
        else:
            assert events[0].prefill_tokens == len(prompt)
        previous = prompt + tokens
        messages.append({"role": "assistant", "content": real_pair.tokenizer.decode(tokens, skip_special_tokens=True)})
