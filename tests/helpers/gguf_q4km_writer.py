"""A tiny dense Qwen2 GGUF laid out as llama.cpp's Q4_K_M lays out the embedded Qwen2.5-Coder pair:
the token embedding and most linears Q4_K; the LM head, and the v and down projections of the layers
Q4_K_M gives more bits (here layer 0), Q6_K; norms and biases float32. Its blocks are random bytes
with sane scales and its widths the MoE files' (helpers/gguf_moe_writer.py: rows of 256 weights).
The fake_q4km_draft fixture installs it as the embedded draft, as fake_draft does the Q8_0 one.
"""

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from helpers.gguf_files import embed_as_draft
from helpers.gguf_moe_writer import (HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE, KV_HEADS, LAYERS, TOKENS, TensorWriter,
                                     write_shape_and_tokenizer)

Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
WIDER = (0,)  # the layers whose v and down projections are Q6_K
# Its 4-bit model's logits against its dense conversion's, the same weights summed in another order:
# float32 rounding only. Measured on the project's AMD EPYC (avx512_bf16), 2026-12-06, on logits up
# to 3.8: at most 1.9e-6 in memory and 1.5e-6 with compact layers (streamed or not); each bound is 2x.
IN_MEMORY_BOUND, COMPACT_BOUND = 3.8e-6, 3.0e-6


def write_q4km_gguf(path: Path, seed: int = 0) -> Path:
    """The tiny Q4_K_M file at `path`."""
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny q4km")
    writer.add_feed_forward_length(INTERMEDIATE)
    write_shape_and_tokenizer(writer)
    tensor = TensorWriter(writer, np.random.default_rng(seed))
    tensor.blocks("token_embd.weight", Q4_K, len(TOKENS), HIDDEN)
    for layer in range(LAYERS):
        write_layer(tensor, f"blk.{layer}", Q6_K if layer in WIDER else Q4_K)
    tensor.vector("output_norm.weight", HIDDEN)
    tensor.blocks("output.weight", Q6_K, len(TOKENS), HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_layer(tensor: TensorWriter, block: str, wider: GGMLQuantizationType) -> None:
    """A decoder layer, its v and down projections in `wider`."""
    tensor.vector(f"{block}.attn_norm.weight", HIDDEN)
    for name, rows, qtype in (("attn_q", HEADS * HEAD_DIM, Q4_K), ("attn_k", KV_HEADS * HEAD_DIM, Q4_K),
                              ("attn_v", KV_HEADS * HEAD_DIM, wider)):
        tensor.blocks(f"{block}.{name}.weight", qtype, rows, HIDDEN)
        tensor.vector(f"{block}.{name}.bias", rows)
    tensor.blocks(f"{block}.attn_output.weight", Q4_K, HIDDEN, HEADS * HEAD_DIM)
    tensor.vector(f"{block}.ffn_norm.weight", HIDDEN)
    tensor.blocks(f"{block}.ffn_gate.weight", Q4_K, INTERMEDIATE, HIDDEN)
    tensor.blocks(f"{block}.ffn_up.weight", Q4_K, INTERMEDIATE, HIDDEN)
    tensor.blocks(f"{block}.ffn_down.weight", wider, HIDDEN, INTERMEDIATE)


@pytest.fixture
def fake_q4km_draft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """DEFAULT_DRAFT replaced by the tiny Q4_K_M model, which has 4-bit weights to run."""
    return embed_as_draft(write_q4km_gguf(tmp_path / "tiny.gguf"), tmp_path, monkeypatch)
