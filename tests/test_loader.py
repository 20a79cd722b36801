"""The loader's last step on a target it loaded: how many LM-head rows the walk computes in one call,
measured on that target's head (decoding/head_rows.py)."""

import pytest
import torch
from helpers.cli import CORPUS, save_tiny_model

from specchat import loader
from specchat.engine_options import EngineOptions


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("pair")
    return str(save_tiny_model(root / "target", CORPUS, seed=0)), str(save_tiny_model(root / "draft", CORPUS, seed=1))


@pytest.mark.parametrize("measured", [1, 8])
def test_the_target_takes_the_head_rows_measured_on_its_own_head(pair, monkeypatch, measured):
    heads = []

    def measure(logits, hidden_size: int, dtype: torch.dtype, device: torch.device) -> int:
        heads.append((logits(torch.zeros(2, hidden_size, dtype=dtype)).shape, hidden_size, dtype, device.type))
        return measured

    monkeypatch.setattr(loader, "measure_head_rows", measure)
    target, draft = pair
    models = loader.load_models(EngineOptions(target=target, draft=draft, dtype="float32", draft_quant="none",
                                              offload="none"), progress=False)
    try:
        config = models.target.model.config
        assert models.target.head_rows == measured
        assert heads == [((2, config.vocab_size), config.hidden_size, torch.float32, models.device.type)]
    finally:
        models.close()
