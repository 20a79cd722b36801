"""The checks and reckonings of `specchat.limits` that several front ends share: the room left
for a reply (`generate`, the chat and the server), capped by the reply's own limit and by the
context's end, refused when none is left; the memory budgets' range (a run and `doctor`)."""

import pytest

from specchat.cli_options import SamplingOptions
from specchat.doctor.command import check_numbers
from specchat.engine_options import EngineOptions
from specchat.errors import ContextOverflow, SpecchatError
from specchat.limits import TEMPERATURE, TOP_P, Bounds, check_memory_budgets, check_text, reply_limit
from specchat.plan.machine import Machine
from specchat.runtime import validate


def test_a_reply_keeps_its_own_limit_where_the_context_has_room():
    assert reply_limit(prompt_tokens=100, max_new_tokens=50, context=1000) == 50


def test_a_reply_is_cut_where_the_context_ends():
    assert reply_limit(prompt_tokens=990, max_new_tokens=50, context=1000) == 10
    assert reply_limit(prompt_tokens=999, max_new_tokens=50, context=1000) == 1  # the last free token


def test_no_limit_of_its_own_takes_the_rest_of_the_context():
    assert reply_limit(prompt_tokens=100, max_new_tokens=None, context=1000) == 900


@pytest.mark.parametrize("prompt_tokens", [1000, 1500])
def test_a_prompt_that_fills_the_context_is_refused_in_one_line(prompt_tokens):
    with pytest.raises(ContextOverflow) as refused:
        reply_limit(prompt_tokens=prompt_tokens, max_new_tokens=50, context=1000)
    assert isinstance(refused.value, SpecchatError)  # the command line prints it as one line, exit code 2
    assert str(refused.value) == (f"the prompt is {prompt_tokens} tokens, which leaves no room for a reply in the "
                                  "1000-token context: shorten it")


@pytest.mark.parametrize(("ram_budget", "vram_budget", "refusal"), [
    (0.0, None, "--ram-budget must be in (0, 1e+06] (got 0.0)"),
    (float("nan"), None, "--ram-budget must be in (0, 1e+06] (got nan)"),
    (None, -2.0, "--vram-budget must be in (0, 1e+06] (got -2.0)"),
    (None, 2e6, "--vram-budget must be in (0, 1e+06] (got 2000000.0)"),
])
def test_a_run_and_doctor_refuse_a_budget_out_of_range_with_the_same_line(ram_budget, vram_budget, refusal):
    for check in (lambda: check_memory_budgets(ram_budget, vram_budget),
                  lambda: validate(EngineOptions(ram_budget=ram_budget, vram_budget=vram_budget)),
                  lambda: check_numbers(Machine(), ram_budget, vram_budget, None)):
        with pytest.raises(SpecchatError) as refused:
            check()
        assert str(refused.value) == refusal


def test_budgets_in_range_or_not_given_pass():
    check_memory_budgets(None, None)
    check_memory_budgets(0.5, 1e6)


def test_a_run_and_doctor_refuse_a_context_out_of_range_with_the_same_line():
    """The --context range is checked with the other options, before anything loads or plans."""
    for check in (lambda: validate(EngineOptions(context=10)),
                  lambda: check_numbers(Machine(), None, None, 10)):
        with pytest.raises(SpecchatError, match=r"^--context must be between 64 and 1048576 \(got 10\)$"):
            check()


def test_bounds_are_written_as_typed():
    """Integers whole, floats shortest: no 1.04858e+06 for a count of tokens."""
    assert Bounds(64, 2**20).describe() == "between 64 and 1048576"
    assert TEMPERATURE.describe() == "between 0 and 5" and TOP_P.describe() == "in (0, 1]"
    assert Bounds(0.0, 1e6, low_open=True).describe() == "in (0, 1e+06]"


@pytest.mark.parametrize("seed", [-1, 2**63, 10**30])
def test_a_seed_outside_a_signed_64_bit_int_is_one_line(seed):
    """bench --compare-hf hands the seed to torch's generator, which raised on 2**63 and past."""
    with pytest.raises(SpecchatError, match=r"--seed must be >= 0 and below 2\*\*63"):
        SamplingOptions().params(seed)
    assert SamplingOptions().params(2**63 - 1).seed == 2**63 - 1


def test_text_with_a_lone_surrogate_is_one_line():
    check_text("the prompt", "café ☃")
    with pytest.raises(SpecchatError, match="the prompt is not UTF-8 text"):
        check_text("the prompt", "hi\udcff")
