"""--draft-quant nf4: the bitsandbytes config on CUDA, clear errors elsewhere."""

import pytest
import torch

from specchat.errors import SpecchatError
from specchat.models import nf4
from specchat.models.nf4 import draft_quantization

CUDA = torch.device("cuda")


def test_none_means_no_quantization():
    assert draft_quantization("none", torch.device("cpu"), torch.bfloat16) is None


def test_nf4_on_cpu_is_a_clear_error():
    with pytest.raises(SpecchatError, match="needs a CUDA device"):
        draft_quantization("nf4", torch.device("cpu"), torch.bfloat16)


def test_nf4_without_bitsandbytes_names_the_extra(monkeypatch):
    monkeypatch.setattr(nf4.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpecchatError, match=r"pip install 'specchat\[nf4\]'"):
        draft_quantization("nf4", CUDA, torch.bfloat16)


def test_nf4_config_asks_for_4bit_normalfloat_in_the_compute_dtype(monkeypatch):
    monkeypatch.setattr(nf4.importlib.util, "find_spec", lambda name: object())
    config = draft_quantization("nf4", CUDA, torch.bfloat16)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
