"""GGUF bytes as the tests write them: random quantized blocks, a tiny byte-level Qwen2 GGUF, and
that GGUF split into fake embedded-model part packages (the fake_draft and tiny_gguf fixtures)."""

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from specchat.models.embedded import EMBEDDED, EmbeddedModel
from specchat.models.parts import Part, numbered_parts
from specchat.models.registry import DEFAULT_DRAFT

TYPE_BYTES = {GGMLQuantizationType.Q4_K: 144, GGMLQuantizationType.Q6_K: 210, GGMLQuantizationType.Q8_0: 34}
BLOCK_WEIGHTS = {GGMLQuantizationType.Q4_K: 256, GGMLQuantizationType.Q6_K: 256, GGMLQuantizationType.Q8_0: 32}
SCALE_OFFSETS = {GGMLQuantizationType.Q4_K: (0, 2), GGMLQuantizationType.Q6_K: (208,), GGMLQuantizationType.Q8_0: (0,)}


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int = 0,
                  scale_range: tuple[float, float] = (1e-4, 1e-3)) -> np.ndarray:
    """Random block bytes, [rows, cols / block * bytes], with each fp16 super-scale drawn from
    `scale_range` (random bytes there would make NaNs)."""
    rng = np.random.default_rng(seed)
    count = rows * cols // BLOCK_WEIGHTS[qtype]
    blocks = rng.integers(0, 256, (count, TYPE_BYTES[qtype]), dtype=np.uint8)
    low, high = scale_range
    for offset in SCALE_OFFSETS[qtype]:
        scales = np.exp(rng.uniform(np.log(low), np.log(high), (count, 1))).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8)
    return blocks.reshape(rows, -1)


FAKE_PREFIX = "specchat-fake-tiny-part"
PART_COUNT = 3


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, the base of every byte-level BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            spelled.append(chr(byte))
        else:
            spelled.append(chr(256 + shifted))
            shifted += 1
    return spelled


def write_tiny_gguf(path: Path) -> None:
    """A 2-layer Qwen2 with a 262-token byte-level vocabulary, Q8_0 matrices (so loading must
    dequantize), a chat template and Qwen's special tokens."""
    rng = np.random.default_rng(0)
    tokens = [*byte_alphabet(), "Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab, hidden, ffn, layers, heads, kv_heads = len(tokens), 64, 128, 2, 4, 2
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny qwen2")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 3) + [3, 3, 3])  # 3 = control (special) tokens
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")

    def matrix(name: str, rows: int, cols: int) -> None:
        values = rng.standard_normal((rows, cols), dtype=np.float32) * 0.05
        writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vector(name: str, size: int) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    q_dim, kv_dim = hidden, hidden // heads * kv_heads
    matrix("token_embd.weight", vocab, hidden)
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden)
        for name, dim in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            matrix(f"blk.{i}.{name}.weight", dim, hidden)
            vector(f"blk.{i}.{name}.bias", dim)
        matrix(f"blk.{i}.attn_output.weight", hidden, q_dim)
        vector(f"blk.{i}.ffn_norm.weight", hidden)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    vector("output_norm.weight", hidden)
    matrix("output.weight", vocab, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def install_part(site: Path, part: Part, piece: bytes | None) -> Path:
    """`part`'s importable package under `site`, laid out like the real part packages, holding
    `piece` as its file (none where `piece` is None); the file's path."""
    package = site / part.module
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if piece is not None:
        (package / part.file).write_bytes(piece)
    return package / part.file


def install_fake_parts(gguf_file: Path, site: Path) -> None:
    """Split `gguf_file` into PART_COUNT importable packages laid out like the real part packages."""
    data = gguf_file.read_bytes()
    step = -(-len(data) // PART_COUNT)
    for index, part in enumerate(numbered_parts(FAKE_PREFIX, PART_COUNT, "1.0")):
        install_part(site, part, data[index * step:(index + 1) * step])


@pytest.fixture
def fake_draft(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EmbeddedModel:
    """DEFAULT_DRAFT replaced by the tiny model, its parts installed, the cache in tmp_path."""
    return embed_as_draft(tiny_gguf, tmp_path, monkeypatch)


def embed_as_draft(gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EmbeddedModel:
    """DEFAULT_DRAFT replaced by `gguf_file`'s model (named "tiny"), its parts installed under
    tmp_path, the cache in tmp_path."""
    site = tmp_path / "site"
    install_fake_parts(gguf_file, site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    data = gguf_file.read_bytes()
    model = EmbeddedModel(DEFAULT_DRAFT, "tiny", numbered_parts(FAKE_PREFIX, PART_COUNT, "1.0"),
                          len(data), hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(EMBEDDED, DEFAULT_DRAFT, model)
    return model
