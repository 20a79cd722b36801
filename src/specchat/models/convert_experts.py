"""A GGUF's stacked MoE experts, one expert at a time, in the forms the GGUF stores them.

llama.cpp stores a MoE layer's E experts stacked: `blk.N.ffn_gate_exps` and `ffn_up_exps` [E, I, H],
`ffn_down_exps` [E, H, I] (gguf.GGUFReader's order: ggml's dimensions reversed; a row's blocks
lie along its last dimension, as a plain linear's do), expert e's weights the slice [e]. transformers
dequantizes them into its fused experts (Qwen2MoeTensorProcessor, Qwen3-MoE's too):
  gate_up_proj [E, 2I, H] = cat(gate[e], up[e]) along the rows, expert by expert,
  down_proj [E, H, I] = down.
Expert e's slices become the split model's linears `experts.e.gate_proj`, `up_proj` and `down_proj`
(quant/split_experts.py): an Int4Weight with its Q4_K scale parts for a Q4_K tensor, a Q6Weight for
a Q6_K one, each checked against its slice of the dense conversion's fused tensor as
models/convert_int4.py checks a linear. In a layer where any of them is kept so, every other expert
linear (another type, a shape the kernels refuse, a failed check) is written as its slice of the
dense conversion, float32: a layer whose experts are split holds every expert linear in some form.
"""

import re
from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from torch import Tensor

from specchat.checkpoint.sources import SafetensorsSource
from specchat.quant.gguf_int4 import matches, q4k_to_int4
from specchat.quant.int4 import int4_fits
from specchat.quant.int4_checkpoint import int4_entries
from specchat.quant.q4k_scales import q4k_entries
from specchat.quant.q6k import q6_entries, q6k_to_weight

CPU = torch.device("cpu")
STACKED = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight")
LINEARS = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}  # quant/split_experts.ExpertLinears'


def expert_tensors(reader: GGUFReader, names: dict[str, str], source: SafetensorsSource) -> dict[str, Tensor]:
    """Every layer's experts, per expert, in the forms the GGUF stores them where it keeps any
    (see above); `names` maps GGUF names to the model's (models/convert_int4.hf_names)."""
    tensors: dict[str, Tensor] = {}
    for layer in stacked_layers(reader, names):
        kept, dense = {}, {}
        for tensor in layer:
            for module, stored, weight in layer_experts(tensor, names, source):
                kept |= stored
                dense |= {} if stored else {f"{module}.weight": weight.clone()}  # cloned: a slice of the fused
        if kept:
            tensors |= kept | dense
    return tensors


def stacked_layers(reader: GGUFReader, names: dict[str, str]) -> list[list[ReaderTensor]]:
    """The GGUF's stacked expert tensors that transformers loads into fused ones, by layer."""
    layers: dict[int, list[ReaderTensor]] = {}
    for tensor in reader.tensors:
        if (found := STACKED.fullmatch(tensor.name)) and tensor.name.removesuffix(".weight") in names:
            layers.setdefault(int(found[1]), []).append(tensor)
    return [layers[index] for index in sorted(layers)]


def layer_experts(tensor: ReaderTensor, names: dict[str, str],
                  source: SafetensorsSource) -> Iterator[tuple[str, dict[str, Tensor], Tensor]]:
    """For each expert's slice of a stacked tensor: its module name, its tensors in the stored
    form (none if it is not kept so) and its dense weight, a view of the dense conversion's."""
    part = STACKED.fullmatch(tensor.name)[2]
    fused = names[tensor.name.removesuffix(".weight")]  # transformers maps the stacked name with no suffix
    experts, reference = fused.rpartition(".")[0], source.get(fused)
    for expert, data in enumerate(tensor.data):
        module, weight = f"{experts}.{expert}.{LINEARS[part]}", expert_slice(reference, expert, part)
        yield module, stored_forms(module, tensor.tensor_type, data, weight), weight


def expert_slice(fused: Tensor, expert: int, part: str) -> Tensor:
    """Expert `expert`'s `part` (gate, up or down) weight [O, I] in transformers' fused tensor:
    gate_up_proj holds gate's I rows, then up's."""
    if part == "down":
        return fused[expert]
    rows = fused.shape[1] // 2
    return fused[expert, :rows] if part == "gate" else fused[expert, rows:]


def stored_forms(module: str, qtype: GGMLQuantizationType, data: np.ndarray, dense: Tensor) -> dict[str, Tensor]:
    """`module`'s tensors in its stored form (an Int4Weight and Q4_K scale parts, or a Q6Weight)
    when a kernel takes it and it is `dense` (the dense conversion's weight); else none."""
    out_features, in_features = dense.shape
    if qtype == GGMLQuantizationType.Q4_K and int4_fits(in_features, out_features, 32, CPU):
        weight = q4k_to_int4(data)
        return int4_entries(module, weight) | q4k_entries(module, data) if matches(weight, dense) else {}
    if qtype == GGMLQuantizationType.Q6_K:
        weight = q6k_to_weight(data)
        return q6_entries(module, weight) if torch.equal(weight.dequantize(), dense) else {}
    return {}
