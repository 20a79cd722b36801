"""The command line as the tests drive it: tiny local model directories (a 2-layer Qwen2 and a
byte-level BPE tokenizer trained here), `specchat` run in-process, and its one-line errors."""

import sys
from pathlib import Path

import pytest
import torch
from helpers.tiny import tiny_qwen_config
from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from specchat.cli import main

CORPUS = ["hello world", "def add(x, y): return x + y", "for item in items: print(item)"] * 20


def train_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer, the kind transformers' Qwen2 loader expects."""
    backend = ByteLevelBPETokenizer()
    backend.train_from_iterator(corpus, vocab_size=300, min_frequency=1, special_tokens=["<eos>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=backend._tokenizer, eos_token="<eos>")


def save_tiny_model(directory: Path, corpus: list[str], seed: int, context: int = 32768) -> Path:
    """A local model directory: a 2-layer Qwen2 and a tokenizer trained on `corpus`."""
    tokenizer = train_tokenizer(corpus)
    torch.manual_seed(seed)
    config = tiny_qwen_config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_attention_heads=2,
                              num_key_value_heads=1, eos_token_id=tokenizer.eos_token_id,
                              max_position_embeddings=context)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("models")
    target = save_tiny_model(root / "target", CORPUS, seed=0)
    draft = save_tiny_model(root / "draft", CORPUS, seed=1)
    other = save_tiny_model(root / "other", ["zebra quartz jumps", "qwerty uiop"] * 20, seed=2)
    return target, draft, other


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["specchat", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    # progress bars of model loading may precede it (carriage-return redraws)
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in errors[0]
