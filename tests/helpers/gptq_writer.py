"""Round-to-nearest 4-bit quantization into the GPTQ checkpoint format, and a writer for
TheBloke-style GPTQ model directories: tiny checkpoints for tests, and 4-bit copies of real
models for comparing bytes moved. RTN is not GPTQ's error-compensating solver; the file format,
which is all a loader sees, is the same.

The words are packed, and read back for the tests' references, as AutoGPTQ's QuantLinear writes
and reads its v1 format, written out here apart from specchat's own packer and reader
(src/specchat/quant/gptq.py), so that a mistake there cannot hide behind the same one here:
  qweight int32 [I/8, O]  word r of column o holds inputs 8r .. 8r + 7, input 8r + j at bits 4j .. 4j + 3
  qzeros  int32 [G, O/8]  word c of group g holds outputs 8c .. 8c + 7 the same way, each zero less one
  scales  fp16  [G, O]    and g_idx int32 [I], each input's group
and the weight is W[o, i] = scales[g, o] * (q[i, o] - zero[g, o]) with g = g_idx[i].
"""

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import AutoConfig, PreTrainedModel

from specchat.checkpoint.skeleton import build_skeleton, decoder_layers, fill, fill_resident, layer_tensors
from specchat.checkpoint.sources import SafetensorsSource
from specchat.quant.gptq import GPTQLinear, GPTQSpec, check_supported, group_count

MAX_Q = 15
BITS = 4
PER_WORD = 32 // BITS  # nibbles in an int32 word


@dataclass(frozen=True)
class QuantizedLinear:
    weight: Tensor  # int [O, I], 0..15
    zeros: Tensor  # int [G, O], 1..15 (the v1 format cannot store 0)
    scales: Tensor  # float16 [G, O]
    g_idx: Tensor  # int32 [I]


def quantize_rtn(weight: Tensor, group_size: int, sym: bool, act_order: bool) -> QuantizedLinear:
    """Round each weight to the nearest point of its (group, output column) grid
    scale * (q - zero), q in 0..15; every element lands within scale / 2 of its value."""
    w = weight.detach().float()
    g_idx = group_index(w, group_size, act_order)
    count = group_count(w.shape[1], group_size)
    # Without act-order a group is a run of columns: a view of the weight, reduced and broadcast
    # (with the gathers and scatters act-order needs, an 8960 x 1536 weight took 0.93 s; so, 0.38 s).
    grouped = None if act_order else w.view(w.shape[0], count, -1)
    groups = g_idx.long().expand_as(w) if act_order else None
    # Every grid contains 0, so the range is widened to include it (as GPTQ does).
    low, high = group_range(w, groups, count) if act_order else (grouped.amin(-1), grouped.amax(-1))
    low, high = low.clamp(max=0), high.clamp(min=0)
    scales, zeros = symmetric_grid(low, high) if sym else asymmetric_grid(low, high)
    if act_order:
        q = torch.round(w / scales.float().gather(1, groups) + zeros.gather(1, groups))
    else:
        q = torch.round(grouped / scales.float()[..., None] + zeros[..., None]).view_as(w)
    return QuantizedLinear(q.clamp(0, MAX_Q).to(torch.uint8), zeros.t().to(torch.uint8), scales.t().contiguous(),
                           g_idx)


def group_range(w: Tensor, groups: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """Each (output, group)'s smallest and largest weight, groups given per element."""
    empty = torch.zeros(w.shape[0], count, device=w.device)
    return (empty.scatter_reduce(1, groups, w, "amin", include_self=False),
            empty.scatter_reduce(1, groups, w, "amax", include_self=False))


def group_index(w: Tensor, group_size: int, act_order: bool) -> Tensor:
    """g_idx [I]; with act-order, rows are grouped in order of descending column norm, the way
    GPTQ groups them in order of descending activation size."""
    size = w.shape[1] if group_size == -1 else group_size
    order = torch.argsort(w.norm(dim=0), descending=True, stable=True) if act_order \
        else torch.arange(w.shape[1], device=w.device)
    g_idx = torch.empty(w.shape[1], dtype=torch.int32, device=w.device)
    g_idx[order] = (torch.arange(w.shape[1], device=w.device) // size).to(torch.int32)
    return g_idx


def fp16_at_least(x: Tensor) -> Tensor:
    """x rounded up into float16 (normal range): the stored scale must not be smaller than the one
    the grid was sized with. Rounding to nearest loses at most 2**-11 relative, 2**-10 covers it."""
    return (x * (1 + 2**-10)).clamp(min=torch.finfo(torch.float16).tiny).to(torch.float16)


def symmetric_grid(low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    # zero 8, grid [-8s, 7s] with s = 2 max|w| / 15: max|w| - 7s = s / 2 at worst.
    scales = fp16_at_least(2 * torch.maximum(-low, high) / MAX_Q)
    return scales, torch.full_like(low, 8)


def asymmetric_grid(low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    # s = (high - low) / 15, zero = round(-low / s): both ends lie within s / 2 of the grid.
    scales = fp16_at_least((high - low) / MAX_Q)
    zeros = torch.round(-low / scales.float())
    # v1 stores zero - 1, so zero 0 is out. It only arises when -low < s / 2; then s' = high / 14
    # exceeds s, and the grid [-s', 14 s'] with zero 1 still covers [low, high].
    scales = torch.where(zeros == 0, fp16_at_least(high / (MAX_Q - 1)), scales)
    return scales, zeros.clamp(min=1)


def autogptq_pack(values: np.ndarray) -> np.ndarray:
    """AutoGPTQ's pack loop along the first axis (`qweight[row] |= intweight[j] << (bits * (j - i))`
    for j in i .. i + 7, i = 8 row): word r holds values 8r .. 8r + 7, the j-th at bits 4j .. 4j + 3,
    as uint32 stored as the int32 of the same bits."""
    values = values.astype(np.uint32)
    words = np.zeros((values.shape[0] // PER_WORD, *values.shape[1:]), dtype=np.uint32)
    for j in range(PER_WORD):
        words |= values[j::PER_WORD] << np.uint32(BITS * j)
    return words.view(np.int32)


def autogptq_unpack(words: np.ndarray) -> np.ndarray:
    """AutoGPTQ's reading of packed words along the first axis, `(word >> 4j) & 0xF` for j in
    0 .. 7: value 8r + j from word r."""
    bits = words.view(np.uint32)
    nibbles = np.stack([(bits >> np.uint32(BITS * j)) & np.uint32(0xF) for j in range(PER_WORD)], axis=1)
    return nibbles.reshape(-1, *words.shape[1:]).astype(np.int64)


def autogptq_weight(qweight: Tensor, qzeros: Tensor, scales: Tensor, g_idx: Tensor) -> Tensor:
    """The float32 [O, I] weight of a GPTQ v1 module as AutoGPTQ dequantizes it: qweight's nibbles
    [I, O], qzeros' (packed along outputs) plus one, W[o, i] = scales[g, o] * (q[i, o] - zero[g, o])."""
    q = torch.from_numpy(autogptq_unpack(qweight.numpy()))
    zeros = torch.from_numpy(autogptq_unpack(qzeros.numpy().T).T.copy()) + 1
    groups = g_idx.long()
    return (scales.float()[groups] * (q - zeros[groups]).float()).t().contiguous()


GPTQ_KEYS = ("qweight", "qzeros", "scales", "g_idx")  # a GPTQ module's tensors, in autogptq_weight's order


def dequantized_tensors(stored: dict[str, Tensor]) -> dict[str, Tensor]:
    """A GPTQ checkpoint's tensors with each module's GPTQ tensors replaced by its `.weight` as
    AutoGPTQ dequantizes it (float32); every other tensor (biases, norms, routers) as stored."""
    modules = {name.removesuffix(".qweight") for name in stored if name.endswith(".qweight")}
    quantized = {f"{module}.{key}" for module in modules for key in GPTQ_KEYS}
    return {name: t for name, t in stored.items() if name not in quantized} | {
        f"{module}.weight": autogptq_weight(*(stored[f"{module}.{key}"] for key in GPTQ_KEYS)) for module in modules}


def pack_gptq(q: QuantizedLinear, bias: Tensor | None) -> dict[str, Tensor]:
    """The tensors one module contributes to a GPTQ v1 checkpoint, packed as AutoGPTQ packs them:
    q [O, I] as qweight by inputs, zero - 1 [G, O] as qzeros by outputs."""
    if (q.zeros < 1).any():
        raise ValueError("GPTQ v1 checkpoints cannot store a zero point of 0")
    zeros = q.zeros.to(torch.int64).numpy() - 1
    packed = {
        "qweight": torch.from_numpy(autogptq_pack(q.weight.t().numpy())),
        "qzeros": torch.from_numpy(np.ascontiguousarray(autogptq_pack(zeros.T).T)),
        "scales": q.scales.to(torch.float16).contiguous(),
        "g_idx": q.g_idx.to(torch.int32),
    }
    if bias is not None:
        packed["bias"] = bias.detach().to(torch.float16).contiguous()
    return packed


def decoder_linears(model: PreTrainedModel) -> dict[str, nn.Linear]:
    """Every nn.Linear inside the decoder layers, by its full module name."""
    inside = {id(module) for module in model.get_decoder().layers.modules()}
    return {
        name: module for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and id(module) in inside
    }


def checkpoint_tensors(model: PreTrainedModel, spec: GPTQSpec, dense: Callable[[str], bool] = lambda name: False
                       ) -> dict[str, Tensor]:
    """The checkpoint's tensors: decoder-layer linears packed but those `dense` names (as AutoGPTQ
    leaves a Qwen2-MoE's shared_expert_gate), every other tensor float16."""
    linears = {name: linear for name, linear in decoder_linears(model).items() if not dense(name)}
    tensors = {}
    for name, linear in linears.items():
        q = quantize_rtn(linear.weight, spec.group_size, spec.sym, spec.desc_act)
        tensors.update({f"{name}.{key}": t for key, t in pack_gptq(q, linear.bias).items()})
    replaced = {f"{name}.{kind}" for name in linears for kind in ("weight", "bias")}
    stored = set()
    for key, t in model.state_dict().items():
        # Tied weights share storage; save them once, under the first name, as save_pretrained does.
        if key in replaced or t.data_ptr() in stored:
            continue
        stored.add(t.data_ptr())
        tensors[key] = t.detach().to(torch.float16).contiguous()
    return tensors


def write_gptq_checkpoint(model: PreTrainedModel, out_dir: Path, spec: GPTQSpec) -> Path:
    """Write `model` as a GPTQ directory: decoder-layer Linears RTN-quantized to 4 bits, every
    other tensor in float16. Returns `out_dir`."""
    settings = {"quant_method": "gptq", "checkpoint_format": "gptq", **asdict(spec)}
    check_supported(settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_tensors(model, spec), out_dir / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict() | {"dtype": "float16", "quantization_config": settings}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "quantize_config.json").write_text(json.dumps(settings, indent=2))
    return out_dir


def dequantized_linears(model: nn.Module) -> nn.Module:
    """Each GPTQLinear replaced by an nn.Linear holding its weight as AutoGPTQ dequantizes it."""
    for name, module in list(model.named_modules()):
        if isinstance(module, GPTQLinear):
            linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            linear.weight.data = autogptq_weight(module.qweight, module.qzeros, module.scales, module.g_idx)
            if module.bias is not None:
                linear.bias.data = module.bias.float()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, linear)
    return model


def load_checkpoint(directory: Path, kernel: torch.device | None) -> nn.Module:
    """The checkpoint as offload_model builds it with every layer resident, in float32 on the CPU:
    GPTQLinears with no `kernel`, Int4Linears packed for it otherwise."""
    source = SafetensorsSource(directory)
    model = build_skeleton(AutoConfig.from_pretrained(directory), source, torch.float32, kernel)
    layers_name, layers = decoder_layers(model)
    cpu = torch.device("cpu")
    fill_resident(model, layers_name, source, torch.float32, cpu)
    for index, layer in enumerate(layers):
        fill(layer, layer_tensors(layer, f"{layers_name}.{index}.", source, torch.float32), cpu)
    return model
