"""Tiny random MoE GGUF files as llama.cpp lays them out: a Qwen3-MoE (architecture `qwen3moe`),
a Qwen2-MoE (`qwen2moe`, with its shared expert and that expert's one-output gate) and a Mixtral
(`llama`, as llama.cpp writes Mixtral), 2 layers of 4 experts routed top-2.

Each layer's experts are stacked: `blk.N.ffn_gate_exps` and `ffn_up_exps` [E, I, H] and
`ffn_down_exps` [E, H, I] (numpy's order, ggml's dimensions reversed), in Q4_K (ffn_down_exps in
Q4_K or Q6_K, as llama.cpp's Q4_K_M mixes them), their blocks random bytes with sane fp16 scales
(gguf's Python package cannot quantize to Q4_K or Q6_K). Q4_K and Q6_K take rows of 256 weights,
so the hidden size is 256 and an expert's width 512 (not Qwen3-MoE's default 768: the width is read
from `expert_feed_forward_length`, models/gguf_config.py; a Mixtral's is its `feed_forward_length`,
as llama.cpp writes it). Attention, the embedding and the LM head
are Q8_0, norms and routers float32.
"""

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType
from helpers.gguf_files import byte_alphabet, random_blocks

ARCHITECTURES = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama"}
EXPERTS, TOP_K, LAYERS = 4, 2, 2
HIDDEN, INTERMEDIATE, SHARED = 256, 512, 256
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
TOKENS = [*byte_alphabet(), "Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Q4_K's d and dmin (and Q6_K's d) drawn from here: weights of a few hundredths, as a real model's
SCALES = (1e-5, 1e-4)


def write_moe_gguf(path: Path, family: str, down: GGMLQuantizationType = GGMLQuantizationType.Q4_K,
                   seed: int = 0) -> Path:
    """A tiny `family` MoE GGUF at `path`, its experts stacked, ffn_down_exps in `down`."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), ARCHITECTURES[family])
    write_metadata(writer, family)
    tensor = TensorWriter(writer, rng)
    tensor.q8("token_embd.weight", len(TOKENS), HIDDEN, 0.05)
    for layer in range(LAYERS):
        write_attention(tensor, family, f"blk.{layer}")
        tensor.vector(f"blk.{layer}.ffn_norm.weight", HIDDEN)
        tensor.dense(f"blk.{layer}.ffn_gate_inp.weight", EXPERTS, HIDDEN, 0.1)  # the router
        tensor.stacked(f"blk.{layer}.ffn_gate_exps.weight", GGMLQuantizationType.Q4_K, INTERMEDIATE, HIDDEN)
        tensor.stacked(f"blk.{layer}.ffn_up_exps.weight", GGMLQuantizationType.Q4_K, INTERMEDIATE, HIDDEN)
        tensor.stacked(f"blk.{layer}.ffn_down_exps.weight", down, HIDDEN, INTERMEDIATE)
        if family == "qwen2_moe":
            write_shared_expert(tensor, f"blk.{layer}")
    tensor.vector("output_norm.weight", HIDDEN)
    tensor.q8("output.weight", len(TOKENS), HIDDEN, 0.4)  # a sharp head: a perturbed draft agrees often
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_metadata(writer: gguf.GGUFWriter, family: str) -> None:
    writer.add_name("tiny moe")
    if family == "mixtral":  # llama.cpp's llama: feed_forward_length is an expert's width
        writer.add_feed_forward_length(INTERMEDIATE)
    else:
        writer.add_feed_forward_length(1024)  # a dense layer's width, which no layer here has
        writer.add_expert_feed_forward_length(INTERMEDIATE)
        writer.add_expert_shared_feed_forward_length(SHARED)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(TOP_K)
    write_shape_and_tokenizer(writer)


def write_shape_and_tokenizer(writer: gguf.GGUFWriter) -> None:
    """What every tiny file here declares alike: context, widths, heads, rope, norm and tokenizer."""
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([1] * (len(TOKENS) - 3) + [3, 3, 3])  # 3 = control (special) tokens
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(TOKENS.index("<|endoftext|>"))
    writer.add_eos_token_id(TOKENS.index("<|im_end|>"))
    writer.add_pad_token_id(TOKENS.index("<|endoftext|>"))


def write_attention(tensor: "TensorWriter", family: str, block: str) -> None:
    """A layer's attention and its norm (Qwen2's q, k, v biases; Qwen3's q and k norms)."""
    tensor.vector(f"{block}.attn_norm.weight", HIDDEN)
    for name, rows in (("attn_q", HEADS * HEAD_DIM), ("attn_k", KV_HEADS * HEAD_DIM), ("attn_v", KV_HEADS * HEAD_DIM)):
        tensor.q8(f"{block}.{name}.weight", rows, HIDDEN, 0.05)
        if family == "qwen2_moe":
            tensor.vector(f"{block}.{name}.bias", rows)
    tensor.q8(f"{block}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM, 0.05)
    if family == "qwen3_moe":
        tensor.vector(f"{block}.attn_q_norm.weight", HEAD_DIM)
        tensor.vector(f"{block}.attn_k_norm.weight", HEAD_DIM)


def write_shared_expert(tensor: "TensorWriter", block: str) -> None:
    """Qwen2-MoE's shared expert (Q4_K, a plain MLP) and its one-output gate (float32 [H])."""
    tensor.q4k(f"{block}.ffn_gate_shexp.weight", SHARED, HIDDEN)
    tensor.q4k(f"{block}.ffn_up_shexp.weight", SHARED, HIDDEN)
    tensor.q4k(f"{block}.ffn_down_shexp.weight", HIDDEN, SHARED)
    tensor.writer.add_tensor(f"{block}.ffn_gate_inp_shexp.weight",
                             (0.1 * tensor.rng.standard_normal(HIDDEN)).astype(np.float32))


class TensorWriter:
    """Adds random tensors of each kind to a GGUFWriter, each from the next seed of `rng`."""

    def __init__(self, writer: gguf.GGUFWriter, rng: np.random.Generator) -> None:
        self.writer, self.rng = writer, rng

    def seed(self) -> int:
        return int(self.rng.integers(2**31))

    def q8(self, name: str, rows: int, cols: int, std: float) -> None:
        values = self.rng.standard_normal((rows, cols), dtype=np.float32) * std
        self.writer.add_tensor(name, gguf.quants.quantize(values, GGMLQuantizationType.Q8_0),
                               raw_dtype=GGMLQuantizationType.Q8_0)

    def q4k(self, name: str, rows: int, cols: int) -> None:
        self.blocks(name, GGMLQuantizationType.Q4_K, rows, cols)

    def blocks(self, name: str, qtype: GGMLQuantizationType, rows: int, cols: int) -> None:
        """A [rows, cols] weight in `qtype` (Q4_K or Q6_K), its blocks random bytes with sane scales."""
        self.writer.add_tensor(name, random_blocks(qtype, rows, cols, self.seed(), SCALES), raw_dtype=qtype)

    def stacked(self, name: str, qtype: GGMLQuantizationType, rows: int, cols: int) -> None:
        """E experts' [rows, cols] weights stacked, [E, rows, bytes a row]."""
        blocks = np.stack([random_blocks(qtype, rows, cols, self.seed(), SCALES) for _ in range(EXPERTS)])
        self.writer.add_tensor(name, blocks, raw_dtype=qtype)

    def dense(self, name: str, rows: int, cols: int, std: float) -> None:
        self.writer.add_tensor(name, (std * self.rng.standard_normal((rows, cols))).astype(np.float32))

    def vector(self, name: str, size: int) -> None:
        self.writer.add_tensor(name, (1 + 0.1 * self.rng.standard_normal(size)).astype(np.float32))
