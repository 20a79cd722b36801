"""The room left for a reply (`limits.reply_limit`), which `generate`, the chat and the server
all take: capped by the reply's own limit and by the context's end, refused when none is left."""

import pytest

from specchat.errors import ContextOverflow, SpecchatError
from specchat.limits import reply_limit


def test_a_reply_keeps_its_own_limit_where_the_context_has_room():
    assert reply_limit(prompt_tokens=100, max_new_tokens=50, context_tokens=1000) == 50


def test_a_reply_is_cut_where_the_context_ends():
    assert reply_limit(prompt_tokens=990, max_new_tokens=50, context_tokens=1000) == 10
    assert reply_limit(prompt_tokens=999, max_new_tokens=50, context_tokens=1000) == 1  # the last free token


def test_no_limit_of_its_own_takes_the_rest_of_the_context():
    assert reply_limit(prompt_tokens=100, max_new_tokens=None, context_tokens=1000) == 900


@pytest.mark.parametrize("prompt_tokens", [1000, 1500])
def test_a_prompt_that_fills_the_context_is_refused_in_one_line(prompt_tokens):
    with pytest.raises(ContextOverflow) as refused:
        reply_limit(prompt_tokens=prompt_tokens, max_new_tokens=50, context_tokens=1000)
    assert isinstance(refused.value, SpecchatError)  # the command line prints it as one line, exit code 2
    assert str(refused.value) == (f"the prompt is {prompt_tokens} tokens, which leaves no room for a reply in the "
                                  "1000-token context: shorten it")
