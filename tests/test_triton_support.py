"""triton_support: whether a Triton kernel can run here, asked before each launch."""

import importlib.util

import pytest
import torch

from specchat import triton_support
from specchat.triton_support import triton_available, triton_installed


def test_without_triton_no_kernel_runs(monkeypatch):
    monkeypatch.setattr(triton_support, "triton_installed", lambda: False)
    assert not triton_available()


def test_installed_is_what_the_import_system_finds():
    assert triton_installed() == (importlib.util.find_spec("triton") is not None)


@pytest.mark.skipif(not triton_installed(), reason="triton is not installed")
@pytest.mark.parametrize("interpret", ["0", "1"])
def test_with_triton_a_kernel_runs_on_a_gpu_or_under_the_interpreter(monkeypatch, interpret):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    assert triton_available() == (torch.cuda.is_available() or interpret == "1")
