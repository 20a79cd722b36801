"""Int8 linears and embeddings (quant/int8.py): within half a quantization step of the dense
weights, on each kernel that runs them (fbgemm's dynamic int8, torch's weight-only int8, the
dequantized product where neither does)."""

import platform

import pytest
import torch
from helpers.tiny import perturbed

from specchat.quant import int8
from specchat.quant.int8 import Int8Embedding, Int8Linear, dense_linear, dynamic_kernel, quantize_linears


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


# Asked of the platform, not of dynamic_kernel: a dynamic_kernel that wrongly said no would skip its own tests
X86 = platform.machine().lower() in ("x86_64", "amd64")
X86_ONLY = pytest.mark.skipif(not X86, reason="fbgemm's dynamic kernel runs on x86 only")


@pytest.mark.parametrize("engine", torch.backends.quantized.supported_engines)
def test_the_dynamic_kernel_serves_cpu_weights_under_fbgemms_engines_alone(monkeypatch, engine):
    monkeypatch.setattr(torch.backends.quantized, "engine", engine)
    assert dynamic_kernel(torch.device("cpu")) == (engine in ("x86", "fbgemm"))
    assert not dynamic_kernel(torch.device("cuda")) and not dynamic_kernel(torch.device("meta"))


def test_x86_runs_the_dynamic_kernel_by_default():
    assert dynamic_kernel(torch.device("cpu")) == X86


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


def test_a_dense_above_linear_multiplies_wide_inputs_with_the_dense_weight():
    torch.manual_seed(0)
    weight, bias = torch.randn(24, 32), torch.randn(24)
    layer = Int8Linear(weight, bias, dense_above=2)
    narrow, wide = torch.randn(2, 32), torch.randn(3, 32)
    assert torch.equal(layer(narrow), Int8Linear(weight, bias)(narrow))
    assert torch.allclose(layer(wide), wide @ weight.t() + bias, atol=1e-5)
    assert not torch.allclose(layer(wide), Int8Linear(weight, bias)(wide), atol=1e-5)


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


def test_rows_quantized_a_block_at_a_time_are_the_whole_weights(monkeypatch):
    torch.manual_seed(0)
    weight = torch.randn(50, 24, dtype=torch.bfloat16)
    whole_scales = weight.float().abs().amax(dim=1) / 127
    whole = (weight.float() / whole_scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    monkeypatch.setattr(int8, "QUANT_ROWS", 7)  # 7 blocks, the last one short
    quantized, scales = int8.quantize_rows(weight)
    assert torch.equal(quantized, whole) and torch.equal(scales, whole_scales)


@pytest.mark.parametrize("in_features, dequantized", [(32, False), (24, True)])
def test_the_weight_only_kernel_takes_widths_of_whole_16s_and_the_rest_is_dequantized(monkeypatch, in_features,
                                                                                   dequantized):
    """torch 2.13's kernel crashes on bf16 rows whose width is not a multiple of 16 (KERNEL_IN_MULTIPLE):
    those, and only those, take the dequantized product."""
    calls = []
    product = int8.dequantized_product
    monkeypatch.setattr(int8, "dequantized_product", lambda *args: calls.append(args) or product(*args))
    torch.manual_seed(0)
    layer = Int8Linear(torch.randn(8, in_features), None, dynamic=False, dtype=torch.bfloat16)
    x = torch.randn(3, in_features, dtype=torch.bfloat16)
    out = layer(x)
    assert bool(calls) == dequantized
    reference = x.float() @ layer.dequantized().float().t()
    # Both paths round to bf16: within 2.8e-3 of the largest output (measured on an AMX Xeon), bound 2^-8 = 3.9e-3
    torch.testing.assert_close(out.float(), reference, rtol=0, atol=2**-8 * reference.abs().max().item())


def test_a_dense_linear_multiplies_by_the_tensors_it_is_given_for_inference():
    weight, bias = torch.randn(6, 10, dtype=torch.bfloat16), torch.randn(6, dtype=torch.bfloat16)
    linear = dense_linear(weight, bias)
    assert linear.weight.data_ptr() == weight.data_ptr() and linear.bias.data_ptr() == bias.data_ptr()
    assert (linear.in_features, linear.out_features) == (10, 6)  # read where linears are converted (quant/fp8.py)
    assert not any(parameter.requires_grad for parameter in linear.parameters())
    x = torch.randn(3, 10, dtype=torch.bfloat16)
    assert torch.equal(linear(x), torch.nn.functional.linear(x, weight, bias))
    assert dense_linear(weight).bias is None
