"""The memory an Int4Linear's forward takes beyond its output, measured on a 8192 x 28672 linear (a
Llama-2-70B MLP projection) in a fresh process, is within `workspace_bytes`, the bound the offload
plan counts; and that bound's parts, worked out.

Measured as the rise of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs)
over its resident set before the call, less the output; glibc is told to map every allocation
above 64 KiB and unmap it when freed, so that memory freed earlier cannot hide a temporary. The
call is made once before it is measured, so that libraries' one-time buffers (about 2 MiB on the
first matmul) are not counted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specchat.quant.int4 import workspace_bytes
from specchat.quant.int4_chunks import chunked_workspace
from specchat.quant.int4_expand import expanded_workspace

IN, OUT = 8192, 28672
SLACK = 1 << 20  # page rounding and allocator headers
CASES = [(1, "fused", "bfloat16"), (1, "chunked", "bfloat16"), (128, "chunked", "float32")]  # rows, path, product

CHILD = """
import json, re, sys
import torch
from specchat.quant.int4 import Int4Linear, int4_tensors
from specchat.quant.widths import UNLIMITED, WidthChoice
from specchat.quant.int4_weight import Int4Weight

IN, OUT = 8192, 28672
generator = torch.Generator().manual_seed(0)
weight = Int4Weight(torch.randint(0, 256, (OUT, IN // 2), dtype=torch.uint8, generator=generator),
                    torch.rand(IN // 32, OUT, generator=generator) / 64,
                    torch.randn(IN // 32, OUT, generator=generator) / 64, None)
linear = Int4Linear(IN, OUT, 32, False, False, torch.bfloat16, torch.device("cpu"))
linear.load_state_dict(int4_tensors(weight, None, torch.bfloat16, torch.device("cpu")))
del weight

def status(key):
    return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

extra = []
for rows, path, product in json.loads(sys.argv[1]):
    linear.widths = WidthChoice(UNLIMITED if path == "fused" else 0, getattr(torch, product))
    x = torch.randn(rows, IN).bfloat16()
    linear(x)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset the peak resident set to the current one
    before = status("VmRSS")
    out = linear(x)
    extra.append(status("VmHWM") - before - out.nbytes)
print(json.dumps(extra))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="measures the peak RSS through Linux's /proc")
@pytest.mark.timeout(600)
def test_a_forwards_extra_memory_is_within_the_stated_workspace():
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], env=env, capture_output=True,
                            text=True, check=True)
    measured = json.loads(result.stdout)
    for (rows, path, _), extra in zip(CASES, measured):
        bound = workspace_bytes(IN, OUT, rows, torch.bfloat16, 32, "cpu", False)
        print(f"{rows} rows, {path}: {extra / 2**20:.2f} MiB extra, bound {bound / 2**20:.2f} MiB")
        assert extra <= bound + SLACK
    # a fraction of the weight's 117 MB
    assert workspace_bytes(IN, OUT, 128, torch.bfloat16, 32, "cpu", False) < 64 << 20


def test_the_workspace_is_the_largest_products_buffers_plus_an_act_order_input():
    """On a CPU the larger of the chunked product's two forms (float32 and the compute dtype); on
    CUDA the expansion's too, here the larger (a chunk of up to 2^26 weights against about 1 Mi);
    with act order the permuted input's copy besides, rows x I in the compute dtype."""
    rows, bf16 = 64, torch.bfloat16
    chunked = max(chunked_workspace(IN, OUT, rows, bf16, product, 32) for product in (torch.float32, bf16))
    expanded = expanded_workspace(IN, OUT, rows, bf16)
    assert expanded > chunked
    assert workspace_bytes(IN, OUT, rows, bf16, 32, "cpu", False) == chunked
    assert workspace_bytes(IN, OUT, rows, bf16, 32, "cuda", False) == expanded
    assert workspace_bytes(IN, OUT, rows, bf16, 32, "cuda", True) == expanded + rows * IN * 2
    assert workspace_bytes(IN, OUT, rows, bf16, 32, "cpu", True) == chunked + rows * IN * 2
