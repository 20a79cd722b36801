"""The draft's approximations (int8 weights, a frequency-ranked sub-vocabulary head): what they
compute, and that decoding through an approximated - or deliberately wrong - draft still emits
exactly the target's tokens."""

import json

import pytest
import torch
from helpers.engines import run
from helpers.tiny import build_tiny, perturbed

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.draft_attention import DraftAttention
from specchat.models.draft_approx import DraftApprox, DroppedHead, approximate_draft
from specchat.models.fused_norms import FusedRMSNorm
from specchat.corpora import sharegpt_records
from specchat.models.vocab_rank import RANK_FILE, chat_texts, head_vocab, rank_tokens, stdlib_texts, vocab_ranking
from specchat.models.draft import DraftQuant, resolve_draft_quant
from specchat.quant import int8, timing, widths
from specchat.quant.int8 import Int8Embedding, Int8Linear, dynamic_kernel, quantize_linears
from specchat.quant.stacked import Part
from specchat.quant.widths import INT8_ROWS, int8_rows, measure_int8_rows

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

GREEDY, SEEDED = SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.9, 7)


class CharTokenizer:
    """One token per character (its code point modulo 50), like the tiny models' vocabulary."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(char) % 50 for char in text]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_weight_only_int8_is_within_half_a_step_per_weight(dtype):
    torch.manual_seed(0)
    weight, bias, x = torch.randn(24, 40), torch.randn(24), torch.randn(3, 5, 40)
    layer = Int8Linear(weight.to(dtype), bias.to(dtype), dynamic=False)
    assert layer.weight.dtype == torch.int8 and layer.packed is None
    assert (layer.dequantized().float() - weight).abs().max() <= layer.scales.float().max() / 2 + 1e-2
    dequantized = layer.dequantized().float()
    exact = x @ dequantized.t() + bias
    out = layer(x.to(dtype)).float()
    assert out.shape == (3, 5, 24)
    # Only rounding separates the two (Higham, Accuracy and Stability, ch. 3): a sum of n products
    # accumulated with unit roundoff u errs by at most n * u * M, M = sum_i |x_i w_i| + |b|. Both
    # accumulate in float32 or wider (CPU matmuls accumulate bf16 in float32), one more rounding
    # each in float32 (the bias's add; exact's cast of the weights); `out` also rounds three
    # times in `dtype`: the input's cast, the product and the bias's add. So 3 * u(dtype) +
    # 2 * (n + 2) * u(float32): about 5e-6 of M in float32 and float64, 0.012 in bfloat16.
    unit = {t: torch.finfo(t).eps / 2 for t in (dtype, torch.float32)}
    magnitude = x.abs() @ dequantized.abs().t() + bias.abs()
    bound = (3 * unit[dtype] + 2 * (x.shape[-1] + 2) * unit[torch.float32]) * magnitude
    assert ((out - exact).abs() <= bound).all()


def test_without_an_int8_kernel_the_weight_is_dequantized_a_block_of_rows_at_a_time(monkeypatch):
    """Where the weight-only kernel does not run (float64 here; a CUDA build without it), the
    product dequantizes DEQUANT_ROWS output rows at a time, never the whole weight, and equals the
    whole dequantized product."""
    torch.manual_seed(0)
    weight, x = torch.randn(40, 24, dtype=torch.float64), torch.randn(3, 24, dtype=torch.float64)
    layer = Int8Linear(weight, None, dynamic=False)
    monkeypatch.setattr(int8, "DEQUANT_ROWS", 16)  # 40 rows: blocks of 16, 16 and 8
    assert int8.row_blocks(40, 16) == [slice(0, 16), slice(16, 32), slice(32, 40)]
    torch.testing.assert_close(layer(x), x @ layer.dequantized().t(), rtol=1e-12, atol=1e-12)


def runs_int8_kernel(device: torch.device) -> bool:
    """Whether torch's weight-only int8 product runs on `device`, found by running it (bf16, the
    dtype both the CPU's and CUDA's kernels take): the dispatcher is not asked here."""
    ones = {"dtype": torch.bfloat16, "device": device}
    weight = torch.ones(16, 32, dtype=torch.int8, device=device)
    try:
        out = torch.ops.aten._weight_int8pack_mm(torch.ones(1, 32, **ones), weight, torch.ones(16, **ones))
    except NotImplementedError:  # "Could not run 'aten::_weight_int8pack_mm' with arguments from the ... backend"
        return False
    assert torch.equal(out.cpu(), torch.full((1, 16), 32.0, dtype=torch.bfloat16))
    return True


def test_the_int8_kernel_is_found_where_it_runs():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert int8.has_int8_kernel(cpu) and runs_int8_kernel(cpu)
    if torch.cuda.is_available():
        expected = runs_int8_kernel(cuda)
    elif not torch.backends.cuda.is_built():
        expected = False  # a torch built without CUDA holds no CUDA kernel at all
    else:
        pytest.skip("a CUDA build of torch without a GPU: only running the kernel would tell whether it has one")
    assert int8.has_int8_kernel(cuda) == expected


X86_ONLY = pytest.mark.skipif(not dynamic_kernel(torch.device("cpu")), reason="fbgemm's dynamic kernel runs on x86 only")


@X86_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dynamic_int8_errs_at_most_half_an_activation_step_per_weight(dtype):
    """fbgemm quantizes the input to 7 bits over its range: each x_i is off by at most
    step / 2 = (max x - min x) / 127 / 2, so output j is off by at most step / 2 * sum_i |w_ji|."""
    torch.manual_seed(0)
    weight, bias, x = torch.randn(24, 64), torch.randn(24), torch.randn(3, 5, 64)
    layer = Int8Linear(weight.to(dtype), bias.to(dtype))
    assert layer.packed is not None
    x = x.to(dtype).float()
    exact = x @ layer.dequantized().float().t() + bias.to(dtype).float()
    bound = (x.max() - x.min()) / 127 / 2 * layer.dequantized().float().abs().sum(1)
    rounding = exact.abs() * (2 ** -7 if dtype == torch.bfloat16 else 1e-6)  # the output cast back to dtype
    out = layer(x.to(dtype))
    assert out.dtype == dtype and out.shape == (3, 5, 24)
    assert ((out.float() - exact).abs() <= bound + rounding + 1e-4).all()
    assert not torch.equal(out.float(), exact)  # the activations were quantized, not multiplied as given


@X86_ONLY
def test_dynamic_int8_packs_the_rows_weight_only_int8_stores():
    torch.manual_seed(0)
    weight = torch.randn(24, 64)
    packed = Int8Linear(weight, None)
    assert packed.weight is None  # the packed copy is the only one
    unpacked, _ = torch.ops.quantized.linear_unpack(packed.packed)
    stored = Int8Linear(weight, None, dynamic=False)
    assert torch.equal(packed.int8_rows(), stored.weight)
    assert torch.allclose(unpacked.q_per_channel_scales().float(), stored.scales.float())
    assert torch.equal(packed.dequantized(), stored.dequantized())


def test_quantize_linears_replaces_every_decoder_linear(tiny_target):
    model = perturbed(tiny_target, 0.0, seed=3).model
    count = quantize_linears(model.get_decoder())
    assert count == 2 * 7  # q, k, v, o, gate, up, down in each of 2 layers
    assert not any(isinstance(m, torch.nn.Linear) for m in model.get_decoder().modules())


def test_rank_puts_frequent_tokens_first_and_unseen_ones_in_id_order():
    ranking = rank_tokens(CharTokenizer(), ["ccc", "bb", "c"], vocab_size=50)
    assert ranking[:2] == [ord("c") % 50, ord("b") % 50]
    assert sorted(ranking) == list(range(50))
    rest = ranking[2:]
    assert rest == sorted(rest)


def test_the_ranking_is_stored_once_beside_the_model(tmp_path):
    ranking = vocab_ranking(tmp_path, CharTokenizer(), vocab_size=50)
    assert json.loads((tmp_path / RANK_FILE).read_text()) == ranking
    (tmp_path / RANK_FILE).write_text(json.dumps(list(reversed(ranking))))
    assert vocab_ranking(tmp_path, CharTokenizer(), vocab_size=50) == list(reversed(ranking))


def test_the_corpus_is_chat_replies_then_code():
    chat, code = chat_texts(50_000), stdlib_texts(50_000)
    assert sum(map(len, chat)) >= 50_000 and sum(map(len, code)) >= 50_000
    assert any("def " in text for text in code)
    assert chat[0] == next(turn["value"] for turn in next(sharegpt_records())["conversations"] if turn["from"] == "gpt")


def test_head_vocab_keeps_the_stop_tokens():
    assert head_vocab(list(range(10)), 3, always=[9]).tolist() == [0, 1, 2, 9]


def approximated(seed: int, tmp_path, vocab_size: int | None, int8: bool) -> CausalLM:
    draft = perturbed(build_tiny(0), 0.3, seed=seed)
    return approximate_draft(draft.model, CharTokenizer(), tmp_path, int8, vocab_size, frozenset({49}))


def test_a_sub_vocabulary_head_scores_only_its_tokens(tmp_path):
    draft = approximated(1, tmp_path, vocab_size=20, int8=True)
    hidden = torch.randn(4, 32, dtype=torch.float64)
    logits = draft.logits(hidden)
    allowed = torch.zeros(50, dtype=torch.bool)
    allowed[draft.vocab] = True
    assert torch.isinf(logits[:, ~allowed]).all() and torch.isfinite(logits[:, allowed]).all()
    values, tokens = draft.top_logprobs(hidden, k=5, temperature=0.7)
    assert allowed[tokens].all() and torch.all(values[:, :-1] >= values[:, 1:])
    assert torch.allclose(values.exp().sum(-1), torch.log_softmax(logits / 0.7, -1).topk(5).values.exp().sum(-1))


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("vocab_size, int8", [(20, True), (None, True), (10, False)])
def test_specexec_over_an_approximated_draft_emits_the_target_tokens(tiny_target, tmp_path, sampling, vocab_size, int8):
    draft = approximated(1, tmp_path, vocab_size, int8)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = TreeEngine(SPECEXEC, tiny_target, draft, [], TreeShape(budget=12, max_depth=6))
    assert run(engine, sampling)[0] == reference


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_prepared_for_cuda_is_stacked_and_its_replies_are_the_targets(tiny_target, sampling):
    """On CUDA every draft form's projections are stacked, its queries and keys rotated together,
    its norms fused, on a CPU only int8's projections stacked: the run's device decides, so this CPU prepares
    a draft for CUDA with its tensors where they are and runs it."""
    drafts = {kind: perturbed(build_tiny(0), 0.3, seed=1).model for kind in ("cuda", "cpu")}
    for kind, model in drafts.items():
        approx = DraftApprox(False, None, device=torch.device(kind))
        for layer in model.model.layers:
            approx.prepare_layer(layer)
        assert approx.draft(model).model is model
    assert isinstance(drafts["cuda"].model.norm, FusedRMSNorm)  # the final norm, once the layers are in
    stacked = [(type(layer.self_attn), type(layer.mlp.up_proj), type(layer.input_layernorm),
                layer.self_attn.config._attn_implementation) for layer in drafts["cuda"].model.layers]
    # its attention as built here; the app packs it as it builds or loads a model (bounded_attention.py)
    assert stacked == [(DraftAttention, Part, FusedRMSNorm, "sdpa")] * len(stacked)
    assert not any(isinstance(module, (Part, FusedRMSNorm, DraftAttention)) for module in drafts["cpu"].modules())
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = TreeEngine(SPECEXEC, tiny_target, CausalLM(drafts["cuda"]), [], TreeShape(budget=12, max_depth=6))
    assert run(engine, sampling)[0] == reference


class RandomDraft(CausalLM):
    """A deliberately wrong draft: its logits are noise, unrelated to anything it ran."""

    def logits(self, hidden):
        return torch.randn(hidden.shape[0], self.model.config.vocab_size)

    def top_logprobs(self, hidden, k, temperature, allowed=None):  # no grammar in these replies
        assert allowed is None
        return torch.log_softmax(self.logits(hidden), -1).topk(k, dim=-1)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_with_random_logits_still_gives_exact_output(tiny_target, tiny_draft, sampling):
    torch.manual_seed(5)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = TreeEngine(SPECEXEC, tiny_target, RandomDraft(tiny_draft.model), [], TreeShape(budget=12, max_depth=6))
    assert run(engine, sampling)[0] == reference


@pytest.mark.parametrize("kind", ["none", "int8", "int4", "nf4"])
def test_an_explicit_draft_quant_is_kept(kind):
    assert resolve_draft_quant(kind, torch.device("cpu"), torch.bfloat16) == DraftQuant(kind)


@pytest.mark.parametrize("rows, expected", [(0, DraftQuant("none")), (4, DraftQuant("int8", 4)),
                                            (INT8_ROWS[-1], DraftQuant("int8"))])
def test_auto_draft_quant_is_int8_on_a_cpu_for_the_widths_where_it_pays(monkeypatch, tmp_path, rows, expected):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))  # a machine that has measured nothing yet
    monkeypatch.setitem(widths.MEASURES, "int8 rows", lambda dtype: rows)
    assert resolve_draft_quant("auto", torch.device("cpu"), torch.bfloat16) == expected
    assert resolve_draft_quant("auto", torch.device("cuda"), torch.bfloat16) == DraftQuant("none")


def test_auto_draft_quant_is_measured_once_per_machine(monkeypatch, tmp_path):
    """Measured at every startup, the crossover flipped between runs (quant/widths.py): the
    second startup keeps the first's choice, whatever a new measurement would say."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    measurements = iter([32, INT8_ROWS[-1]])
    monkeypatch.setitem(widths.MEASURES, "int8 rows", lambda dtype: next(measurements))
    first = resolve_draft_quant("auto", torch.device("cpu"), torch.bfloat16)
    assert first == DraftQuant("int8", 32)
    assert resolve_draft_quant("auto", torch.device("cpu"), torch.bfloat16) == first
    assert next(measurements) == INT8_ROWS[-1]  # the second was never measured


def test_int8_never_pays_without_a_kernel_for_the_dtype():
    assert int8_rows(torch.float64) == 0


def test_a_dense_above_linear_multiplies_wide_inputs_with_the_dense_weight():
    torch.manual_seed(0)
    weight, bias = torch.randn(24, 32), torch.randn(24)
    layer = Int8Linear(weight, bias, dense_above=2)
    narrow, wide = torch.randn(2, 32), torch.randn(3, 32)
    assert torch.equal(layer(narrow), Int8Linear(weight, bias)(narrow))
    assert torch.allclose(layer(wide), wide @ weight.t() + bias, atol=1e-5)
    assert not torch.allclose(layer(wide), Int8Linear(weight, bias)(wide), atol=1e-5)


@pytest.mark.parametrize("wins_up_to", [0, 1, 4, 64])
def test_int8_rows_is_the_widest_input_up_to_which_int8_always_wins(monkeypatch, wins_up_to):
    """The choice, not the clock: a stand-in for the timer that lets int8 (the first product timed)
    win at the widths of INT8_ROWS up to `wins_up_to`, and at 32 rows past a loss."""
    timed = []

    def stand_in(first, second, device) -> bool:
        timed.append(device)
        rows = INT8_ROWS[len(timed) - 1]
        return rows <= wins_up_to or rows == 32  # a win past a loss does not count

    monkeypatch.setattr(timing, "faster", stand_in)
    assert measure_int8_rows(torch.bfloat16) == wins_up_to
    assert set(timed) == {torch.device("cpu")}  # int8's dynamic kernel is a CPU's


def test_an_int8_embedding_row_is_within_half_a_step_of_the_dense_row():
    torch.manual_seed(0)
    weight = torch.randn(30, 16, dtype=torch.bfloat16)
    embedding = Int8Embedding(weight)
    ids = torch.tensor([[0, 29, 7], [7, 3, 3]])
    rows = embedding(ids)
    assert rows.shape == (2, 3, 16) and rows.dtype == torch.bfloat16 and embedding.rows.dtype == torch.int8
    steps = embedding.scales[ids][..., None]
    # the dense row to half a step, then one bf16 rounding of the product
    assert ((rows.float() - weight[ids].float()).abs() <= steps / 2 + rows.float().abs() * 2**-8).all()


def test_an_int8_draft_looks_up_int8_rows_and_lets_its_whole_head_go(tmp_path):
    draft = approximated(1, tmp_path, vocab_size=20, int8=True)
    assert isinstance(draft.model.get_input_embeddings(), Int8Embedding)
    assert isinstance(draft.model.get_output_embeddings(), DroppedHead)
    with pytest.raises(RuntimeError, match="sub-vocabulary"):
        draft.model.get_output_embeddings()(torch.randn(1, 32, dtype=torch.float64))
    whole = approximated(1, tmp_path, vocab_size=None, int8=True)
    assert isinstance(whole.model.get_output_embeddings(), Int8Linear)


def test_rows_quantized_a_block_at_a_time_are_the_whole_weights(monkeypatch):
    torch.manual_seed(0)
    weight = torch.randn(50, 24, dtype=torch.bfloat16)
    whole_scales = weight.float().abs().amax(dim=1) / 127
    whole = (weight.float() / whole_scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    monkeypatch.setattr(int8, "QUANT_ROWS", 7)  # 7 blocks, the last one short
    quantized, scales = int8.quantize_rows(weight)
    assert torch.equal(quantized, whole) and torch.equal(scales, whole_scales)
