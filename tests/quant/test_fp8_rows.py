"""fp8_rows: the one Triton kernel that scales and rounds an fp8 linear's input rows, run on the CPU by
Triton's interpreter and compared bit for bit with fp8.quantize_rows (torch's five kernels); compiled
for Hopper and Ada here, so that a construct their compiler refuses is caught without a GPU.

The kernel's largest magnitude is tl.max, a function of Triton's library, decorated in the mode
TRITON_INTERPRET had when triton was first imported: the comparisons run in a process of their own
that sets it first (one process for all of them, ~10 s)."""

import json
import os
import subprocess
import sys
from functools import cache

import pytest
import torch

from specchat.quant import fp8_rows
from specchat.quant.fp8_rows import fused_rows_serve

pytest.importorskip("triton", reason="triton is not installed (the test extra installs it on x86-64 Linux)")

# Each case: rows drawn from a seed, some scaled as a step meets them, quantized both ways; the
# process prints, per case, whether the fp8 bytes and the scales are equal.
COMPARE = """
import json, torch
from specchat.quant.fp8 import FP8_MAX, INVERSE_MAX, TINY, quantize_rows
from specchat.quant.fp8_rows import quantize_rows_fused

def rows_for(cols, dtype, strided):
    rows = torch.randn(5, cols + 32 * strided, generator=torch.Generator().manual_seed(cols)).to(dtype)
    rows[1] *= 3e3  # a row of large magnitudes (a down projection's input in a massive activation)
    rows[2] *= 1e-3
    rows[3] = 0.0  # a static step's pad row: zeros, its scale TINY / 448
    return rows[:, :cols] if strided else rows  # viewed out of a wider buffer: each row contiguous, the rows apart

equal = {}
for cols in (16, 48, 4096, 14336):  # one block, a tail, a 7B's/8B's widths
    for dtype in (torch.bfloat16, torch.float32):
        for strided in (False, True):
            rows = rows_for(cols, dtype, strided)
            quantized, scale = quantize_rows_fused(rows, TINY, INVERSE_MAX, FP8_MAX)
            expected, expected_scale = quantize_rows(rows)
            same_bytes = torch.equal(quantized.view(torch.uint8), expected.view(torch.uint8))
            equal[f"{cols} {str(dtype)[6:]} {'strided' if strided else 'contiguous'}"] = (
                same_bytes and torch.equal(scale, expected_scale))
# a row whose scale is 1 (its largest magnitude 448) and whose values lie halfway between e4m3's:
# 17 and 19 (steps of 2), 248 and -200 (steps of 16), 2^-6 + 2^-10 (a normal's half step), and
# 9 and 3 half steps of 2^-9 (subnormals): ties go to the even neighbour
ties = torch.tensor([[448.0, 17.0, 19.0, 248.0, -200.0, 2**-6 + 2**-10, 9 * 2**-10, -3 * 2**-10]])
quantized, scale = quantize_rows_fused(ties, TINY, INVERSE_MAX, FP8_MAX)
expected, expected_scale = quantize_rows(ties)
equal["ties"] = torch.equal(quantized.view(torch.uint8), expected.view(torch.uint8)) and scale.item() == 1.0
equal["ties go to even"] = quantized.float().tolist()[0][1:5] == [16.0, 20.0, 256.0, -192.0]
empty = quantize_rows_fused(torch.empty(0, 64, dtype=torch.bfloat16), TINY, INVERSE_MAX, FP8_MAX)
equal["no rows"] = empty[0].shape == (0, 64) and empty[1].shape == (0, 1)
print(json.dumps(equal))
"""


@cache
def compared() -> dict[str, bool]:
    done = subprocess.run([sys.executable, "-c", COMPARE], env=os.environ | {"TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_rows_quantize_as_torchs_kernels_do_bit_for_bit():
    cases = compared()
    assert len(cases) == 19  # 4 widths x 2 dtypes x contiguous or strided, the ties (twice), and no rows
    assert [case for case, equal in cases.items() if not equal] == []


class CudaRows:
    """What fused_rows_serve reads of CUDA rows, on a machine without CUDA."""

    def __init__(self, cols: int, stride: int = 1) -> None:
        self.is_cuda, self.shape, self.step = True, (2, cols), stride

    def stride(self, dim: int) -> int:
        return self.step if dim == 1 else self.shape[1] * self.step


def test_only_cuda_rows_of_a_held_width_are_served(monkeypatch):
    assert not fused_rows_serve(torch.zeros(2, 64))  # a CPU's rows: torch's kernels
    assert fp8_rows.WIDEST == 16384
    monkeypatch.setattr(fp8_rows, "triton_available", lambda: True)
    assert fused_rows_serve(CudaRows(64)) and fused_rows_serve(CudaRows(16384))
    assert not fused_rows_serve(CudaRows(16385))  # wider than a program holds
    assert not fused_rows_serve(CudaRows(64, stride=2))  # a row's inputs apart
    monkeypatch.setattr(fp8_rows, "triton_available", lambda: False)
    assert not fused_rows_serve(CudaRows(64))


@pytest.mark.parametrize("arch", [90, 89])
def test_the_kernel_compiles_for_a_gpu_without_one(arch, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # decorated for a GPU, not for the interpreter
    import triton
    from triton.backends.compiler import GPUTarget

    signature = {"x_ptr": "*bf16", "out_ptr": "*u8", "scale_ptr": "*fp32", "cols": "i32", "stride": "i32",
                 "tiny": "fp32", "inverse": "fp32", "largest_fp8": "fp32"}
    constants = {"BLOCK": 16384}
    source = triton.compiler.ASTSource(fn=fp8_rows._kernel(False), signature=signature | dict.fromkeys(constants,
                                       "constexpr"), constexprs=constants)
    options = {"num_warps": fp8_rows.WARPS_FROM[constants["BLOCK"]], "enable_fp_fusion": False}  # as a launch asks
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    assert compiled.asm["cubin"]
