"""Engines on tiny random models: exactness against sequential decoding and HF generate."""

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from helpers.engines import GREEDY, PROMPT, chi_square_pvalue, exact_token_distribution, run

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.decoding.kvcache import new_cache
from specchat.decoding.llama_cuts import cut_top_n_sigma, cut_xtc, xtc_cuts_at
from specchat.decoding.sampling import filter_logits
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine


def test_autoregressive_greedy_equals_hf_generate(tiny_target):
    engine = AutoregressiveEngine(tiny_target, stop_ids=[])
    tokens, events = run(engine, GREEDY)
    reference = tiny_target.model.generate(
        torch.tensor([PROMPT]), max_new_tokens=40, min_new_tokens=40, do_sample=False
    )[0, len(PROMPT):].tolist()
    assert tokens == reference
    assert len(events) == 40 and events[-1].finished


@pytest.mark.parametrize("budget,depth", [(1, 1), (8, 4), (32, 8), (100, 12)])
@pytest.mark.parametrize(
    "sampling", [GREEDY, SamplingParams(0.6, 0.9, seed=11), SamplingParams(1.0, 1.0, seed=5)]
)
def test_specexec_matches_autoregressive(tiny_target, tiny_draft, budget, depth, sampling):
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=budget, max_depth=depth))
    tokens, events = run(engine, sampling)
    assert tokens == reference
    assert all(e.tree_size <= budget and e.depth <= depth for e in events)
    assert sum(len(e.token_ids) for e in events) == 40 and events[-1].finished


def test_specexec_under_top_k_and_min_p_matches_autoregressive_within_the_cut(tiny_target, tiny_draft):
    sampling = SamplingParams(1.3, 1.0, seed=5, top_k=3, min_p=0.1)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    tokens, _ = run(TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=8)), sampling)
    assert tokens == reference
    sequence = PROMPT + tokens
    logits = tiny_target.logits(tiny_target.hidden(torch.tensor(sequence), torch.arange(len(sequence)), new_cache()))
    rows = logits[len(PROMPT) - 1:-1].float()
    chosen = rows.gather(1, torch.tensor(tokens)[:, None])
    assert ((rows > chosen).sum(dim=1) < 3).all()  # each token among the 3 likeliest: the cut reached the sampler
    # and at least 0.1 x the likeliest at temperature 1.3: logit >= the largest + 1.3 log 0.1
    assert (chosen.squeeze(1) >= rows.max(dim=1).values + 1.3 * math.log(0.1)).all()


def test_specexec_under_typical_p_matches_autoregressive_within_the_typical_set(tiny_target, tiny_draft):
    sampling = SamplingParams(1.0, 1.0, seed=7, typical_p=0.3)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    tokens, _ = run(TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=8)), sampling)
    assert tokens == reference
    assert tokens != run(AutoregressiveEngine(tiny_target, []), replace(sampling, typical_p=1.0))[0]
    sequence = PROMPT + tokens
    logits = tiny_target.logits(tiny_target.hidden(torch.tensor(sequence), torch.arange(len(sequence)), new_cache()))
    kept = torch.isfinite(filter_logits(logits[len(PROMPT) - 1:-1].float(), 1.0, 1.0, typical_p=0.3))
    assert kept.gather(1, torch.tensor(tokens)[:, None]).all()  # each token in its position's typical set
    assert (kept.sum(dim=1) < logits.shape[-1] // 2).all()  # which is small: the cut binds


def test_specexec_under_top_n_sigma_and_xtc_matches_autoregressive_within_their_cuts(tiny_target, tiny_draft):
    """XTC's coin keyed by (seed, position): the tree cannot move it; where it fell, the likeliest
    tokens (all but the least of those over the threshold) were never emitted."""
    sampling = SamplingParams(1.0, 1.0, seed=7, top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.05)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    tokens, events = run(TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=8)),
                         sampling)
    assert tokens == reference and sum(e.accepted for e in events) > 0
    plain = replace(sampling, top_n_sigma=-1.0, xtc_probability=0.0)
    assert tokens != run(AutoregressiveEngine(tiny_target, []), plain)[0]
    sequence = PROMPT + tokens
    logits = tiny_target.logits(tiny_target.hidden(torch.tensor(sequence), torch.arange(len(sequence)), new_cache()))
    rows = logits[len(PROMPT) - 1:-1].float()
    within = torch.isfinite(cut_top_n_sigma(rows, 1.0))
    assert within.gather(1, torch.tensor(tokens)[:, None]).all() and (within.sum(dim=1) < rows.shape[-1] // 2).all()
    fell = [j for j in range(len(tokens)) if xtc_cuts_at(7, len(PROMPT) + j, 0.5)]
    excluded = [~torch.isfinite(cut_xtc(cut_top_n_sigma(rows[j], 1.0), 0.05)) & within[j] for j in fell]
    assert sum(int(cut.any()) for cut in excluded) >= 5  # the coin fell where it had top choices to drop
    assert not any(cut[tokens[j]] for j, cut in zip(fell, excluded))


def test_specexec_under_a_dynamic_temperature_matches_autoregressive(tiny_target, tiny_draft):
    """The temperature set by each position's entropy, after min-p cut the untempered logits: a
    function of the position's logits, so the tree cannot change it; the reply differs from one at
    the fixed temperature, and each token lies in min-p's set at temperature 1."""
    sampling = SamplingParams(0.8, 1.0, seed=11, min_p=0.02, dynatemp_range=0.7, dynatemp_exponent=0.5)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    tokens, events = run(TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=8)),
                         sampling)
    assert tokens == reference and sum(e.accepted for e in events) > 0
    assert tokens != run(AutoregressiveEngine(tiny_target, []), replace(sampling, dynatemp_range=0.0))[0]
    sequence = PROMPT + tokens
    logits = tiny_target.logits(tiny_target.hidden(torch.tensor(sequence), torch.arange(len(sequence)), new_cache()))
    kept = torch.isfinite(filter_logits(logits[len(PROMPT) - 1:-1].float(), 1.0, 1.0, min_p=0.02))
    assert kept.gather(1, torch.tensor(tokens)[:, None]).all()


def test_specexec_accepts_draft_tokens(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=8))
    _, events = run(engine, GREEDY)
    assert sum(e.accepted for e in events) > 0
    assert len(events) < 40  # fewer target passes than tokens


def test_self_draft_accepts_whole_greedy_chain(tiny_target):
    """With the target as its own draft and a chain-shaped tree, every draft token is accepted."""
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_target, [], TreeShape(budget=6, max_depth=6, max_children=1))
    tokens, events = run(engine, GREEDY, max_new_tokens=22)
    assert [e.accepted for e in events] == [0, 6, 6, 6]  # the prompt's pass emits the first token
    assert tokens == run(AutoregressiveEngine(tiny_target, []), GREEDY, 22)[0]


def test_stops_at_stop_token(tiny_target, tiny_draft):
    reference, _ = run(AutoregressiveEngine(tiny_target, []), GREEDY)
    stop = reference[10]
    first = reference.index(stop)
    for engine in (
        AutoregressiveEngine(tiny_target, [stop]),
        TreeEngine(SPECEXEC, tiny_target, tiny_draft, [stop], TreeShape(budget=16, max_depth=6)),
    ):
        tokens, events = run(engine, GREEDY)
        assert tokens == reference[: first + 1]
        assert events[-1].finished


def test_budget_change_applies_mid_reply(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=4, max_depth=4))
    stream = engine.generate(PROMPT, 30, GREEDY)
    first = next(stream)
    engine.apply(LiveSettings(budget=20))
    rest = list(stream)
    assert first.tree_size <= 4 and max(e.tree_size for e in rest) > 4
    tokens = first.token_ids + [t for e in rest for t in e.token_ids]
    assert tokens == run(AutoregressiveEngine(tiny_target, []), GREEDY, 30)[0]


def test_specexec_sampled_distribution_chi_square(tiny_target, tiny_draft):
    """Across seeds, the third token (the second the trees give, after the prompt's pass gave
    the first) follows the filtered target distribution."""
    base = SamplingParams(temperature=1.3, top_p=0.95, seed=0)
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=6, max_depth=2))
    samples = [run(engine, SamplingParams(base.temperature, base.top_p, seed), max_new_tokens=3) for seed in range(600)]
    # both routes to the third token occur: accepted from the first tree, and drawn at a new root
    assert {len(events) for _, events in samples} == {2, 3}
    counts = Counter(tokens[2] for tokens, _ in samples)
    expected = exact_token_distribution(tiny_target, base, 2)
    support = torch.nonzero(expected > 0).flatten().tolist()
    assert set(counts) <= set(support)
    assert chi_square_pvalue([counts.get(t, 0) for t in support], expected[support]) > 1e-3


def test_depth_change_applies_mid_reply(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=32, max_depth=1))
    stream = engine.generate(PROMPT, 30, GREEDY)
    prefilled, first = next(stream), next(stream)
    engine.apply(LiveSettings(depth=6))
    rest = list(stream)
    assert first.depth == 1 and max(e.depth for e in rest) > 1
    assert prefilled.token_ids + first.token_ids + [t for e in rest for t in e.token_ids] == run(AutoregressiveEngine(tiny_target, []), GREEDY, 30)[0]
