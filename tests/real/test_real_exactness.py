"""Exactness on the real embedded Qwen pair in float32 (design.md section 8), judged by
tests/helpers/exactness.py: a divergence passes only as a near-tie of the engine's token, then the
comparison re-anchors and goes on to the end; at most one tie per prompt.

Judged here: specexec in each configuration, chain SD and SpecInfer greedy (DSI, seeded:
test_dsi_real.py). The pair's draft carries both of the app's CPU approximations (int8 and the
sub-vocabulary head: tests/helpers/real_pair.py); the 4-bit and CUDA-prepared drafts have tests
of their own. The suite runs 2 MT-Bench prompts x 32 new tokens per configuration (a draft form's
check: one prompt a mode) to keep CI short;
scripts/check_exactness.py runs the full acceptance (5 prompts x 64 tokens) with the same
checks and records it in docs/benchmarks.md.
"""

import copy
from collections.abc import Callable
import dataclasses
import math

import pytest
import torch
from helpers.engines import GREEDY, Alternating, hf_filter
from helpers.real_pair import PAPER_SAMPLING, emitted, real_draft

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.autosize import Costs
from specchat.decoding.chain_sd import CHAIN_SD
from specchat.decoding.events import ALONE, DRAFTED, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.llama_cuts import cut_xtc, xtc_cuts_at
from specchat.decoding.dry import DryWindow, dry_of
from specchat.decoding.mirostat import Mirostat
from specchat.decoding.penalties import Penalties, Window
from specchat.decoding.prediction import quoted_prediction
from specchat.decoding.sampling import filter_logits, nucleus_floor
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.specinfer import SPECINFER
from specchat.decoding.static_step import static_draft
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat import bounded_attention
from specchat.models.draft_approx import DraftApprox, approximate_draft
from specchat.models.draft_attention import DraftAttention
from specchat.quant.fp8 import Fp8Linear
from specchat.quant.int4 import Int4Linear
from specchat.quant.int8 import Int8Linear

pytestmark = pytest.mark.real


def assert_equals_hf_greedy(real_check, engine, references) -> None:
    """design.md section 8 (tests/helpers/exactness.py): HF greedy's tokens, up to one near-tie."""
    outputs = [emitted(engine, prompt_ids, GREEDY) for prompt_ids, _ in references]
    for (prompt_ids, reference), (tokens, _) in zip(references, outputs):
        comparison = real_check.compare(prompt_ids, reference, tokens, GREEDY)
        assert comparison.acceptable, comparison.describe()
    assert sum(e.accepted for _, events in outputs for e in events) > 0  # the draft is used


def bounded_in_calls_of_8(monkeypatch) -> list[int]:
    """The target's attention as every model's is (bounded_attention.py: its 12 query heads packed
    as rows of its 2 KV heads), its calls forced to 8 query rows: a 33-token tree pass attends in
    five calls of 6-7 rows, as a 70B's 2049-token pass after 4096 tokens would on a math path in 31
    calls of 66-67. Returns the query rows of each call that was split, as it happens."""
    split, in_calls = [], bounded_attention.in_calls
    monkeypatch.setattr(bounded_attention, "rows_per_call", lambda heads, keys: 8)
    monkeypatch.setattr(bounded_attention, "in_calls", lambda query, *args: split.append(query.shape[2])
                        or in_calls(query, *args))
    return split


def test_greedy_specexec_in_bounded_attention_calls_equals_hf_generate(real_pair, real_check, greedy_references,
                                                                      monkeypatch):
    """K=64, the target attending in bounded calls (bounded_in_calls_of_8); smaller and changing
    trees: the 4-bit and static-shape drafts (K=16) and --budget auto below. The draft is the
    suite's (tests/helpers/real_pair.py: int8, its sub-vocabulary head)."""
    attention = real_pair.target.model.model.layers[0].self_attn
    assert attention.config._attn_implementation == bounded_attention.GROUPED
    split = bounded_in_calls_of_8(monkeypatch)
    engine = TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=64))
    assert_equals_hf_greedy(real_check, engine, greedy_references)
    assert max(split) > 8  # tree passes went through the bounded calls


def test_seeded_specexec_in_bounded_attention_calls_equals_seeded_autoregressive(real_pair, real_check,
                                                                                seeded_references, monkeypatch):
    """K=32, the target attending in bounded calls, as above. (Budget 32: seeded trees of 64 cost
    twice as many target passes per token on this CPU as trees of 16.)"""
    split = bounded_in_calls_of_8(monkeypatch)
    engine = TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=32))
    assert_seeded_exact(real_check, engine, seeded_references)
    assert max(split) > 8


# Chain SD and SpecInfer (their tiny-model tests: test_sd.py, test_specinfer.py) are judged here, in
# the module that holds the pair and HF's greedy references: in a module of their own each loaded the
# pair again (~15 s on the AMX Xeon), and under xdist computed the references again on its worker.
def test_greedy_sd_equals_hf_generate(real_pair, real_check, greedy_references):
    engine = TreeEngine(CHAIN_SD, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=8))
    assert_equals_hf_greedy(real_check, engine, greedy_references)


def test_greedy_specinfer_equals_hf_generate(real_pair, real_check, greedy_references):
    engine = TreeEngine(SPECINFER, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=16))
    assert_equals_hf_greedy(real_check, engine, greedy_references)


def seeded_specexec_exact(real_pair, real_check, prompt_ids: list[int],
                          sampling: Callable[[], SamplingParams]) -> tuple[list[int], list[int]]:
    """Seeded SpecExec at budget 32 against seeded autoregressive decoding of `prompt_ids`, each run
    under its own `sampling()` (a reply's states are its own): the comparison acceptable and drafts
    accepted. Returns (the reference, SpecExec's tokens)."""
    reference, _ = emitted(AutoregressiveEngine(real_pair.target, real_pair.stop_ids), prompt_ids, sampling())
    engine = TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=32))
    tokens, events = emitted(engine, prompt_ids, sampling())
    comparison = real_check.compare(prompt_ids, reference, tokens, sampling())
    assert comparison.acceptable, comparison.describe()
    assert sum(e.accepted for e in events) > 0
    return reference, tokens


def test_seeded_specexec_under_every_cut_equals_seeded_autoregressive(real_pair, real_check, seeded_references):
    """A served request's top_n_sigma, top_k, min_p, typical_p and XTC cut the target's distribution
    in the one filter every engine samples through, XTC where its coin fell at the position: one
    prompt, as a draft form's check, hot enough that the cuts bind."""
    sampling = SamplingParams(temperature=1.5, top_p=1.0, seed=1234, top_k=8, min_p=0.05, typical_p=0.95,
                              top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.1)
    prompt_ids = seeded_references[0][0]
    reference, tokens = seeded_specexec_exact(real_pair, real_check, prompt_ids, lambda: sampling)
    with torch.inference_mode():
        rows = real_pair.target.model(torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1:-1].float()
    chosen, picked = rows.gather(1, torch.tensor(tokens)[:, None]), torch.tensor(tokens)[:, None]
    assert ((rows > chosen).sum(dim=1) < 8).all()  # each among the 8 likeliest
    assert (chosen.squeeze(1) >= rows.max(dim=1).values + 1.5 * math.log(0.05)).all()  # >= 0.05 x the likeliest
    cut = filter_logits(rows, 1.5, 1.0, 8, 0.05, 0.95, 1.0)
    assert torch.isfinite(cut).gather(1, picked).all()  # each in its position's n-sigma and typical sets
    wider = torch.isfinite(filter_logits(rows, 1.5, 1.0, 8, 0.05, 0.95)).sum(dim=1)
    assert (torch.isfinite(cut).sum(dim=1) < wider).sum() >= 2  # where n-sigma cut what the others kept
    fell = [j for j in range(len(tokens)) if xtc_cuts_at(1234, len(prompt_ids) + j, 0.5)]
    dropped = [torch.isfinite(cut[j]) & ~torch.isfinite(cut_xtc(cut[j], 0.1)) for j in fell]
    assert sum(int(d.any()) for d in dropped) >= 2  # the coin fell where two or more were top choices
    assert not any(d[tokens[j]] for d, j in zip(dropped, fell))  # and none of those was emitted


def test_seeded_specexec_under_mirostat_equals_seeded_autoregressive(real_pair, real_check, seeded_references):
    """Mirostat 2 cuts each position at the reply's mu, which every emitted token moves: one prompt,
    as a draft form's check, at the paper's sampling, whose seeded reply without mirostat it changes."""
    spec = Mirostat(2, tau=2.0)

    def sampling() -> SamplingParams:  # a fresh state each reply, as each front end makes one
        return dataclasses.replace(PAPER_SAMPLING, mirostat=spec.start())

    prompt_ids, uncut = seeded_references[0]
    reference, _ = seeded_specexec_exact(real_pair, real_check, prompt_ids, sampling)
    assert reference != uncut  # mirostat, not top-p, cut the target's distributions


def test_seeded_specexec_under_a_dynamic_temperature_equals_seeded_autoregressive(real_pair, real_check,
                                                                                  seeded_references):
    """llama.cpp's dynamic temperature over the paper's sampling: top-p cuts the untempered logits,
    then each position's temperature is set by the entropy of what it kept; one prompt, as a draft
    form's check, whose seeded reply at the fixed temperature it changes."""
    sampling = dataclasses.replace(PAPER_SAMPLING, dynatemp_range=0.5, dynatemp_exponent=0.75)
    prompt_ids, fixed = seeded_references[0]
    reference, _ = seeded_specexec_exact(real_pair, real_check, prompt_ids, lambda: sampling)
    assert reference != fixed  # the dynamic temperature, not the fixed one, shaped the distributions


def test_seeded_specexec_under_llama_cpps_penalties_and_a_bias_equals_seeded_autoregressive(real_pair, real_check,
                                                                                       seeded_references):
    """A served request's logit bias, repetition penalties and DRY (llama.cpp's: all over the last 64
    tokens of the prompt and the reply, DRY's breakers as Qwen's tokenizer writes llama.cpp's, its
    allowed length 1 so that 32 tokens meet it), applied as each token is emitted: one prompt, as a
    draft form's check; the bias bans the unpenalized reply's first token, so the penalties bind."""
    prompt_ids, unpenalized = seeded_references[0]
    window, dry = Window(last=64), dry_of(1.0, 1.75, 1, 64, real_pair.tokenizer)
    penalties = Penalties(bias=((unpenalized[0], -100.0),), repeat=1.3, presence=0.4, frequency=0.2,
                          repeat_window=window, count_window=window, dry=dry)

    def sampling() -> SamplingParams:  # each run spends its own state
        return dataclasses.replace(PAPER_SAMPLING, penalties=penalties.start(prompt_ids))

    reference, tokens = seeded_specexec_exact(real_pair, real_check, prompt_ids, sampling)
    assert reference[0] != unpenalized[0]
    bound = 0
    repeats = DryWindow(dry, prompt_ids)
    for token in tokens:
        bound += bool(repeats.repeats())
        repeats.accept(token)
    assert bound > 0 and len(dry.restarts) > 4  # DRY penalized somewhere; "\n" and ":" in many words


def test_a_4_bit_rounded_draft_keeps_greedy_and_seeded_exact(real_pair, real_check, greedy_references,
                                                            seeded_references):
    """--draft-quant int4 (auto's candidate on a GPU): the draft's decoder linears rounded to 4
    bits and run packed through the int4 kernels; the target's tokens are unchanged."""
    draft = real_draft(int8=False, int4=True)
    assert any(isinstance(module, Int4Linear) for module in draft.model.modules())
    engine = TreeEngine(SPECEXEC, real_pair.target, draft, real_pair.stop_ids, TreeShape(budget=16))
    assert_greedy_and_seeded_exact(real_check, engine, greedy_references, seeded_references)


def test_a_draft_prepared_as_on_cuda_in_fp8_at_static_shapes_keeps_greedy_and_seeded_exact(real_pair, real_check,
                                                                                          greedy_references,
                                                                                          seeded_references):
    """The draft as a GPU with fp8 units may run it, here on the CPU: prepared for CUDA (q/k/v and
    gate/up stacked, queries and keys rotated together, norms as torch's rms_norm, its 14 query
    heads packed as rows of its 2 KV heads: models/draft_approx.py), its linears (the stacks' too)
    in fp8 (--draft-quant fp8: quant/fp8.py, multiplied here as its widened_product does), stepping
    at a bucket's static shapes (decoding/static_step.py, run eagerly where CUDA replays a graph);
    the target's tokens are unchanged. One test for the forms together: each changes which trees
    grow, never what the target picks, and the suite's 25 minutes hold one such run."""
    loaded = real_draft(int8=False)  # its head scoring the app's sub-vocabulary
    DraftApprox(False, None, device=torch.device("cuda"), fp8=True).prepared(loaded.model)  # its layers, in place
    attention = loaded.model.model.layers[0].self_attn
    assert isinstance(attention, DraftAttention) and attention.config._attn_implementation == bounded_attention.GROUPED
    assert isinstance(attention.qkv, Fp8Linear)
    assert sum(isinstance(module, Fp8Linear) for module in loaded.model.modules()) == 4 * 24  # qkv, o, gate_up, down
    draft = static_draft(loaded, capacity=4096, capture=False)
    engine = TreeEngine(SPECEXEC, real_pair.target, draft, real_pair.stop_ids, TreeShape(budget=16))
    assert_greedy_and_seeded_exact(real_check, engine, greedy_references, seeded_references)


def test_a_target_head_read_a_row_at_a_time_keeps_greedy_and_seeded_exact(real_pair, real_check, greedy_references,
                                                                         seeded_references):
    """The walk's head rows one a call (decoding/head_rows.py: where each row costs a call, as a
    bf16 head on a CPU without bf16 instructions), whatever this machine measured: each row the
    walk reads is computed alone as it reaches it, and the target's tokens are unchanged."""
    rows: list[int] = []
    target = dataclasses.replace(real_pair.target, head_rows=1)
    head = target.logits
    target.logits = lambda hidden: rows.append(hidden.shape[0]) or head(hidden)
    engine = TreeEngine(SPECEXEC, target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=16))
    assert_greedy_and_seeded_exact(real_check, engine, greedy_references, seeded_references)
    assert rows and set(rows) == {1}


def assert_greedy_and_seeded_exact(real_check, engine, greedy_references, seeded_references) -> None:
    """A draft form's check: greedy on the first prompt, seeded on the last (the second, unless the
    run is scaled down to one: tests/helpers/suite_scale.py). A draft's form changes which trees
    grow, never what the target picks, so each mode is judged once, on trees that differ from the
    suite's draft's (its own runs: every prompt, both modes, above), so that the suite's 25 minutes
    hold them on the machines it was sized for."""
    assert_equals_hf_greedy(real_check, engine, greedy_references[:1])
    assert_seeded_exact(real_check, engine, seeded_references[-1:])


def assert_seeded_exact(real_check, engine, seeded_references) -> None:
    """Seeded autoregressive decoding's tokens at the paper's sampling, up to one near-tie."""
    for prompt_ids, reference in seeded_references:
        tokens, _ = emitted(engine, prompt_ids, PAPER_SAMPLING)
        comparison = real_check.compare(prompt_ids, reference, tokens, PAPER_SAMPLING)
        assert comparison.acceptable, comparison.describe()


CAP = 32


@pytest.mark.parametrize("sampling", [GREEDY, PAPER_SAMPLING], ids=["greedy", "seeded"])
def test_budget_auto_is_exact(real_pair, real_check, greedy_references, seeded_references, sampling):
    """--budget auto over fixed costs of an offloaded target (a pass costs about the same whatever
    the tree) and a cheap draft: trees grow to the cap, 32, and every emitted token is the target's.
    Under those costs auto's own choice always drafts; here the choice is scripted (two iterations
    drafting, three the target alone, ...; test_budget_auto.Alternating) so that drafting goes off
    and on again within each reply, the draft cache falling behind and catching up; the rule that
    makes the choice is test_autosize's. On the AMX Xeon every tree reached the cap, so the seeded
    case is also seeded SpecExec at a fixed budget of 32 (a test of that alone emitted the same
    tokens, tree for tree: it was dropped). A tree may stop a node or two short where the draft's
    last nodes are too unlikely to pay for their step (another CPU's draft form), so the test
    asserts the cap is reached, not that every tree reaches it; trees of 64 are
    test_greedy_specexec_in_bounded_attention_calls_equals_hf_generate's."""
    costs = Costs(target_n=(1, 1025), target_s=(2.0, 2.2), draft_b=(1, 64, 128), draft_s=(0.05, 0.1, 0.2))
    sizer = Alternating(costs, cap=CAP)
    engine = TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids,
                        TreeShape(budget=sizer.cap, sizer=sizer), sizer)
    references = greedy_references if sampling is GREEDY else seeded_references
    for prompt_ids, reference in references:
        tokens, events = emitted(engine, prompt_ids, sampling)
        comparison = real_check.compare(prompt_ids, reference, tokens, sampling)
        assert comparison.acceptable, comparison.describe()
        trees = [e for e in events[1:] if e.drafting == DRAFTED]  # events[0] is the prompt's pass
        assert {e.drafting for e in events[1:]} == {DRAFTED, ALONE}
        assert all(e.tree_size <= CAP for e in trees) and all(e.predicted_accepted > 0 for e in trees)
        assert max(e.tree_size for e in trees) == CAP
        assert sum(e.accepted for e in trees) > 0  # drafted tokens were accepted, after catch-ups too


EDIT = ("Rename the variable `n` to `count` in this function. Reply with the whole function in one Python code "
        "block and nothing else.\n\n```python\ndef mean(values):\n    n = len(values)\n    if n == 0:\n"
        "        return 0.0\n    return sum(values) / n\n```")


@pytest.mark.parametrize("sampling", [GREEDY, PAPER_SAMPLING], ids=["greedy", "seeded"])
def test_a_reply_to_quoted_code_with_it_as_its_prediction_is_the_reply_without(real_pair, real_check, sampling):
    """The chat's and `generate`'s predicted output: the code the message quotes, scored as a chain
    in each tree once the reply reaches it (decoding/prediction.py). An edit's reply repeats most of
    it: the same tokens as without (up to a near-tie), in no more iterations (this pair's draft
    copies code well already: what the chain gains is scripts/bench_prediction.py's to measure)."""
    prompt_ids = real_pair.chat(EDIT)

    def reply(prediction) -> tuple[list[int], list]:
        engine = TreeEngine(SPECEXEC, real_pair.target, real_pair.draft, real_pair.stop_ids, TreeShape(budget=16))
        events = list(engine.generate(prompt_ids, 48, dataclasses.replace(sampling, prediction=prediction)))
        return [t for e in events for t in e.token_ids], events

    plain, plain_events = reply(None)
    prediction = quoted_prediction(EDIT, real_pair.tokenizer)
    predicted, events = reply(prediction)
    comparison = real_check.compare(prompt_ids, plain, predicted, sampling)
    assert comparison.acceptable, comparison.describe()
    assert prediction.accepted > len(predicted) // 2  # the reply followed the quoted code
    assert len(events) <= len(plain_events)


def int8_copy(pair) -> CausalLM:
    """The target as a draft with its decoder linears and head in int8, as `--draft` names the
    target's own model builds it (models/draft_approx.py), made from the held float32 weights: a
    copy of the module tree that shares every parameter, whose linears are then replaced, so the
    target stays as it is and no second copy of its weights is loaded."""
    shared = {id(parameter): parameter for parameter in pair.target.model.parameters()}
    model = copy.deepcopy(pair.target.model, shared)
    return approximate_draft(model, pair.tokenizer, pair.directory, True, None, pair.stop_ids)


def test_an_int8_copy_of_the_target_as_draft_keeps_sampling_exact(real_pair, real_check, seeded_references):
    """The disk tier's draft (SubSpec's idea): the target's own weights in int8 on fbgemm's
    dynamic kernel. It proposes what the target samples far more often than the 0.5B draft, so
    whole branches are accepted, and every emitted token is still the seeded target's."""
    draft = int8_copy(real_pair)
    assert not any(isinstance(module, Int8Linear) for module in real_pair.target.model.modules())
    engine = TreeEngine(SPECEXEC, real_pair.target, draft, real_pair.stop_ids, TreeShape(budget=32))
    for prompt_ids, reference in seeded_references[:1]:  # one prompt: a draft form's check, as above
        tokens, events = emitted(engine, prompt_ids, PAPER_SAMPLING)
        comparison = real_check.compare(prompt_ids, reference, tokens, PAPER_SAMPLING)
        assert comparison.acceptable, comparison.describe()
        assert len(tokens) / len(events) > 3  # tokens per target pass: long accepted branches


def test_top_p_on_the_target_logits_is_hfs_and_rarely_needs_the_sort(real_pair, seeded_references):
    """Along the seeded replies, the target's own distributions: at every position the cut is
    HF's TopPLogitsWarper's, and the fast nucleus search (no vocabulary sort) finds it at most."""
    temperature, top_p = PAPER_SAMPLING.temperature, PAPER_SAMPLING.top_p
    positions = found = 0
    for prompt_ids, reference in seeded_references:
        with torch.inference_mode():
            logits = real_pair.target.model(torch.tensor([prompt_ids + reference])).logits[0, len(prompt_ids) - 1:]
        for row in logits.float():
            assert torch.equal(filter_logits(row, temperature, top_p), hf_filter(row, temperature, top_p))
            found += nucleus_floor(row / temperature, top_p) is not None
            positions += 1
    assert found >= 0.8 * positions, (found, positions)
