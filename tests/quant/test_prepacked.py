"""Dense linears prepacked for oneDNN (quant/prepacked.py): the same products, bit for bit, on the
CPUs whose oneDNN has a bf16 inner product; nn.Linear kept everywhere else."""

import pytest
import torch
from helpers.tiny import tiny_qwen_config
from torch import nn
from transformers import Qwen2ForCausalLM

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.quant import prepacked, timing
from specchat.quant.int8 import Int8Linear
from specchat.quant.prepacked import PrepackedLinear, prepack_linears, prepackable
from specchat.quant.widths import PREPACK_ROWS, prepack_pays


def supported() -> bool:
    """Whether this CPU's oneDNN multiplies a prepacked bf16 weight at all, found by trying oneDNN's
    own ops (on x86 without AVX-512 it may not; then nothing is prepacked, which the last test
    checks). Not through PrepackedLinear: a broken one would skip the tests that check it."""
    weight, x = torch.ones(8, 16, dtype=torch.bfloat16), torch.ones(1, 16, dtype=torch.bfloat16)
    try:
        torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(weight, 1), None, "none", [], "")
    except RuntimeError:
        return False
    return True


# Never skipped by a timing: whether prepacking pays here decides only what prepack_linears does,
# and the tests that check the products make it pay (monkeypatch) or build the linears directly.
ONEDNN_BF16 = pytest.mark.skipif(not supported(), reason="this CPU's oneDNN has no bf16 inner product to prepack for")


@pytest.fixture
def pays(monkeypatch) -> None:
    """prepack_linears replaces every prepackable linear, whatever this CPU's probe measured."""
    monkeypatch.setattr(prepacked, "prepack_pays", lambda dtype: dtype in prepacked.PREPACKED_DTYPES)


@ONEDNN_BF16
@pytest.mark.parametrize("bias", [False, True])
def test_a_prepacked_linear_gives_f_linear_bits_at_every_width(bias):
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(384, 640, bias=bias, dtype=torch.bfloat16).requires_grad_(False)
    linear.weight.copy_(torch.randn(640, 384, generator=generator))
    packed = PrepackedLinear.from_linear(linear)
    assert packed.packed_weight.nbytes == linear.weight.nbytes  # the same bytes, laid out for the kernel
    assert repr(packed) == "PrepackedLinear(in_features=384, out_features=640, prepacked for oneDNN)"
    with torch.inference_mode():
        for rows in (1, 2, 3, 16, 64, 257):
            x = torch.randn(rows, 384, generator=generator).to(torch.bfloat16)
            assert torch.equal(packed(x), linear(x)), rows
        x = torch.randn(2, 5, 384, generator=generator).to(torch.bfloat16)
        assert torch.equal(packed(x), linear(x))


def tiny_model(tie: bool, dtype: torch.dtype = torch.bfloat16) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = tiny_qwen_config(vocab_size=256, hidden_size=64, intermediate_size=128, max_position_embeddings=64,
                              tie_word_embeddings=tie)
    return Qwen2ForCausalLM(config).to(dtype).eval().requires_grad_(False)


def logits(model) -> torch.Tensor:
    lm, prompt = CausalLM(model), torch.tensor([5, 17, 3, 88, 42])
    return lm.logits(lm.hidden(prompt, torch.arange(5), new_cache()))


@ONEDNN_BF16
def test_a_model_scores_as_before_with_its_linears_prepacked(pays):
    model = tiny_model(tie=False)
    before = logits(model)
    assert prepack_linears(model) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the LM head
    assert isinstance(model.get_output_embeddings(), PrepackedLinear)
    assert torch.equal(logits(model), before)


def test_where_prepacking_does_not_pay_every_linear_stays(monkeypatch):
    monkeypatch.setattr(prepacked, "prepack_pays", lambda dtype: False)
    model = tiny_model(tie=False)
    assert prepack_linears(model) == 0 and not any(isinstance(m, PrepackedLinear) for m in model.modules())


def test_a_tied_head_float32_and_other_kernels_stay_as_they_are():
    tied = tiny_model(tie=True)
    head = tied.get_output_embeddings()
    shared = {tied.get_input_embeddings().weight.data_ptr()}
    assert not prepackable(head, shared)  # the embedding reads the same tensor
    assert not prepackable(nn.Linear(4, 4), set())  # float32: oneDNN packs it only through MKL
    assert not prepackable(Int8Linear(torch.ones(8, 16), None), set())
    mlp = tied.model.layers[0].mlp
    assert all(prepackable(m, shared) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))


@ONEDNN_BF16
def test_a_models_tied_head_stays_plain_while_its_other_linears_are_prepacked(pays):
    tied = tiny_model(tie=True)
    assert prepack_linears(tied) == 2 * 7  # the shared weight found by prepack_linears itself
    assert type(tied.get_output_embeddings()) is nn.Linear
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight


@ONEDNN_BF16
def test_a_weight_is_prepacked_only_where_its_copy_fits_the_room(pays):
    model = tiny_model(tie=False)
    head = model.get_output_embeddings().weight.nbytes  # 256 x 64 bf16: the largest weight
    assert prepack_linears(model, room=head - 1) == 2 * 7  # every layer's linear, not the head
    assert isinstance(model.get_output_embeddings(), nn.Linear)
    assert prepack_linears(model, room=head) == 1


@ONEDNN_BF16
@pytest.mark.parametrize("plain_wins_at, pays", [(None, True), (PREPACK_ROWS[0], False), (PREPACK_ROWS[-1], False)])
def test_prepacking_pays_where_the_timer_finds_f_linear_faster_at_no_width(monkeypatch, tmp_path, plain_wins_at,
                                                                          pays):
    """The choice, not the clock: a stand-in for the timer that lets F.linear (the first product
    timed) win at one width of PREPACK_ROWS, or at none; on a machine that has measured nothing yet,
    and the next process there reads the choice instead of timing again."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    timed = []

    def stand_in(first, second, device) -> bool:
        plain, packed = first(), second()
        assert torch.equal(plain, packed)  # one product, two layouts
        timed.append(plain.shape[0])
        return plain.shape[0] == plain_wins_at

    monkeypatch.setattr(timing, "faster", stand_in)
    prepack_pays.cache_clear()
    try:
        assert prepack_pays(torch.bfloat16) is pays
        assert timed == list(PREPACK_ROWS[:PREPACK_ROWS.index(plain_wins_at) + 1] if plain_wins_at else PREPACK_ROWS)
        prepack_pays.cache_clear()  # another process on the same machine
        monkeypatch.setattr(timing, "faster", lambda first, second, device: pays)  # measured again: not `pays`
        assert prepack_pays(torch.bfloat16) is pays
    finally:
        prepack_pays.cache_clear()


def test_float32_never_pays():
    assert not prepack_pays(torch.float32)


@pytest.mark.skipif(supported(), reason="this CPU's oneDNN has a bf16 inner product: the tests above use it")
def test_without_a_bf16_inner_product_prepacking_never_pays():
    assert not prepack_pays(torch.bfloat16)
    model = tiny_model(tie=False)
    assert prepack_linears(model) == 0
