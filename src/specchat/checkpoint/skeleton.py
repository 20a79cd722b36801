"""A model built without its weights (on the meta device), then filled tensor by tensor.

Offloading must never hold the whole model in memory: the module tree is created empty, the
resident parts (embeddings, final norm, LM head, the first R layers) are filled from the
checkpoint on the compute device, and every other layer goes straight to layer storage.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from specchat.bounded_attention import bound_attention
from specchat.checkpoint.sources import SafetensorsSource
from specchat.errors import SpecchatError
from specchat.quant.awq import awq_int4_tensors, is_awq_packed, read_awq_spec, replace_linears_with_awq
from specchat.quant.gptq import read_gptq_spec, replace_linears_with_gptq
from specchat.quant.int4 import Int4Linear, int4_tensors
from specchat.quant.int4_checkpoint import INT4_SUFFIXES, int4_modules, read_int4
from specchat.quant.int4_embedding import Int4Embedding
from specchat.quant.int4_gptq import gptq_int4_tensors, replace_linears_with_gptq_int4
from specchat.quant.int4_pack import pack
from specchat.quant.int4_weight import Int4Weight
from specchat.quant.q4k_scales import Q4K_SUFFIXES, Q4KScalesLinear
from specchat.quant.q6k import q6_modules
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.split_experts import split_experts, split_stored_experts

_QWEIGHT = ".qweight"


def build_skeleton(config: PretrainedConfig, source: SafetensorsSource | None, dtype: torch.dtype,
                   kernel: torch.device | None = None, compact_head: bool = False,
                   compact_layers: bool = False) -> PreTrainedModel:
    """The model's modules on the meta device; GPTQ linears where the checkpoint has packed ones
    (with no checkpoint, from a config alone: the decoder layers' linears AutoGPTQ quantizes,
    `layer_linears`; a MoE block's experts split into their linears where it holds them per expert,
    quant/split_experts.py, for AWQ alike), as Int4Linears packed for `kernel`'s int4 kernels when it
    is given (their weights never expanded; `layer_tensors` converts the checkpoint's); Int4Linears wherever the
    checkpoint holds Int4Weights (quant/int4_checkpoint.py), packed for `kernel` or the CPU, and Q6Linears
    for the experts it holds Q6Weights of (their MoE blocks split: split_stored_experts); with
    `compact_head`, a Q6Linear for the LM head the checkpoint holds a Q6Weight of (quant/q6k.py);
    with `compact_layers`, for every decoder layer linear it holds one of, and Q4KScalesLinears for
    the layers' Int4Linears it holds Q4_K scale parts of (quant/q4k_scales.py). AWQ linears are
    Int4Linears packed for `kernel` (or the CPU) from the start (quant/awq.py)."""
    spec, awq = read_gptq_spec(config.to_dict()), read_awq_spec(config.to_dict())
    config = without_quantization(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    bound_attention(model)  # a wide pass holds what the plan counts for it
    if awq is not None or spec is not None:  # a MoE block's experts quantized per expert, by either method
        split_experts(model, None if source is None else packed_linears(model, source))
    if awq is not None:
        replace_linears_with_awq(model, packed_linears(model, source), awq, dtype, kernel or torch.device("cpu"))
    if spec is not None:
        if kernel is None:
            replace_linears_with_gptq(model, packed_linears(model, source), spec)
        else:
            replace_linears_with_gptq_int4(model, packed_linears(model, source), spec, dtype, kernel)
    if source is not None:
        split_stored_experts(model, source.names(), dtype)  # a GGUF's 4-bit experts, kept per expert
        replace_with_int4(model, source, dtype, kernel or torch.device("cpu"))
    if compact_head:
        replace_head_with_q6(model, source)
    if compact_layers:
        compact_the_layers(model, source, dtype)
    model.eval()
    return model


def without_quantization(config: PretrainedConfig) -> PretrainedConfig:
    """`config` without its quantization_config: the model's dense form."""
    return config.__class__.from_dict({k: v for k, v in config.to_dict().items() if k != "quantization_config"})


def packed_linears(model: PreTrainedModel, source: SafetensorsSource | None) -> list[str]:
    """The linears a GPTQ or AWQ checkpoint holds packed (a qweight each); from a config alone,
    every linear of the decoder layers, as AutoGPTQ and AutoAWQ quantize them."""
    if source is None:
        return layer_linears(model)
    return [name[: -len(_QWEIGHT)] for name in source.names() if name.endswith(_QWEIGHT)]


def has_compact_layers(model: PreTrainedModel, source: SafetensorsSource) -> bool:
    """Whether the checkpoint holds any decoder layer linear in a compact form (a Q6Weight, or
    Q4_K scale parts) that `compact_layers` would build."""
    layers_name, _ = decoder_layers(model)
    return bool(q6_layer_linears(model, source)) or any(
        name.startswith(layers_name + ".") and name.endswith(Q4K_SUFFIXES[0]) for name in source.names())


def q6_layer_linears(model: PreTrainedModel, source: SafetensorsSource) -> list[str]:
    """The decoder layers' linears the checkpoint holds Q6Weights for."""
    layers_name, _ = decoder_layers(model)
    return [name for name in q6_modules(source.names()) if name.startswith(layers_name + ".")]


def compact_the_layers(model: PreTrainedModel, source: SafetensorsSource | None, dtype: torch.dtype) -> None:
    """The decoder layers' linears in the compact forms the checkpoint holds (Q6Weights, Q4_K scale parts)."""
    replace_layers_with_q6(model, source, dtype)
    replace_layers_scales_with_q4k(model, source)


def replace_layers_scales_with_q4k(model: PreTrainedModel, source: SafetensorsSource | None) -> None:
    """An empty Q4KScalesLinear in place of each decoder layer Int4Linear the checkpoint holds
    Q4_K scale parts for."""
    layers_name, _ = decoder_layers(model)
    held = set() if source is None else set(source.names())
    for name, linear in list(model.named_modules()):
        if type(linear) is Int4Linear and name.startswith(layers_name + ".") and name + Q4K_SUFFIXES[0] in held:
            with torch.device("meta"):
                model.set_submodule(name, Q4KScalesLinear(linear.in_features, linear.out_features, linear.group_size,
                                                          linear.bias is not None, False, linear.compute_dtype,
                                                          torch.device(linear.kernel)))


def replace_layers_with_q6(model: PreTrainedModel, source: SafetensorsSource | None, dtype: torch.dtype) -> None:
    """An empty Q6Linear in place of each decoder layer linear the checkpoint holds a Q6Weight for."""
    for name in [] if source is None else q6_layer_linears(model, source):
        linear = model.get_submodule(name)
        with torch.device("meta"):
            model.set_submodule(name, Q6Linear(linear.in_features, linear.out_features, linear.bias is not None, dtype))


def q6_head(model: PreTrainedModel, source: SafetensorsSource) -> str | None:
    """The LM head's module name when the checkpoint holds a Q6Weight for it (and it is not the
    input embedding too)."""
    if model.config.tie_word_embeddings:
        return None
    head = module_name(model, model.get_output_embeddings())
    return head if head in q6_modules(source.names()) else None


def replace_head_with_q6(model: PreTrainedModel, source: SafetensorsSource | None) -> None:
    """An empty Q6Linear in the LM head's place; one line when the checkpoint holds no Q6Weight for it."""
    if source is None or q6_head(model, source) is None:
        raise SpecchatError("this checkpoint holds no Q6_K LM head to keep compact")
    head = model.get_output_embeddings()
    with torch.device("meta"):
        model.set_output_embeddings(Q6Linear(head.in_features, head.out_features))


def replace_with_int4(model: PreTrainedModel, source: SafetensorsSource, dtype: torch.dtype,
                      kernel: torch.device) -> None:
    """Swap each nn.Linear the checkpoint holds an Int4Weight for by an empty Int4Linear, and an
    nn.Embedding by an empty Int4Embedding."""
    for name in int4_modules(source.names()):
        module = model.get_submodule(name)
        groups = source.shape(name + INT4_SUFFIXES[1])[0]
        with torch.device("meta"):
            if isinstance(module, nn.Embedding):
                packed = Int4Embedding(module.num_embeddings, module.embedding_dim, groups, dtype)
            else:
                packed = Int4Linear(module.in_features, module.out_features, module.in_features // groups,
                                    module.bias is not None, False, dtype, kernel)
        model.set_submodule(name, packed)


def layer_linears(model: PreTrainedModel) -> list[str]:
    """The dotted names of the decoder layers' nn.Linears that AutoGPTQ and AutoAWQ quantize: all
    but those of one output (Qwen2-MoE's shared_expert_gate, the scalar its sigmoid scales the shared
    expert by), which neither lists and which no 4-bit format packs (8 outputs a word)."""
    layers_name, layers = decoder_layers(model)
    return [f"{layers_name}.{index}.{name}" for index, layer in enumerate(layers)
            for name, module in layer.named_modules() if isinstance(module, nn.Linear) and module.out_features > 1]


def decoder_layers(model: PreTrainedModel) -> tuple[str, nn.ModuleList]:
    """The decoder layer list and its dotted name (e.g. 'model.layers')."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise SpecchatError(f"{type(model).__name__} has no decoder layer list: it cannot be offloaded")
    name = module_name(model, layers)
    return name, layers


def layer_tensors(layer: nn.Module, prefix: str, source: SafetensorsSource, dtype: torch.dtype,
                  wanted: Callable[[str], bool] = lambda name: True) -> dict[str, torch.Tensor]:
    """A layer's checkpoint tensors, named as in its state_dict (those `wanted`); parameters cast
    to `dtype`, buffers (GPTQ's packed words, scales, group index) kept as the skeleton declares
    them, and an Int4Linear's packed from its Int4Weight, GPTQ or AWQ tensors."""
    parameters = dict(layer.named_parameters(remove_duplicate=False))
    packed = {name: module for name, module in layer.named_modules()
              if isinstance(module, Int4Linear) and wanted(name + ".")}
    tensors = {
        name: source.get(prefix + name).to(dtype if name in parameters else meta.dtype)
        for name, meta in layer.state_dict(keep_vars=True).items()
        if name.rpartition(".")[0] not in packed and wanted(name)
    }
    for name, linear in packed.items():
        tensors.update({f"{name}.{key}": tensor for key, tensor in packed_tensors(linear, prefix + name, source).items()})
    return tensors


def packed_tensors(linear: Int4Linear, module: str, source: SafetensorsSource) -> dict[str, torch.Tensor]:
    """An Int4Linear's buffers, packed for its kernel from the checkpoint's Int4Weight, GPTQ or AWQ tensors."""
    if module + INT4_SUFFIXES[0] not in source.where:
        convert = awq_int4_tensors if is_awq_packed(source.shape(module + _QWEIGHT), linear.in_features) \
            else gptq_int4_tensors
        # converted where its kernel runs (integer work, exact on any device): on the project's 2
        # CPU cores a Llama-3.1-70B AWQ layer took 5.6 s to convert, 7.5 minutes for 80 layers
        kernel = torch.device(linear.kernel)
        return convert(lambda key: source.get(f"{module}.{key}").to(kernel), linear)
    bias = source.get(module + ".bias") if linear.bias is not None else None
    weight, device = stored_int4(module, source), torch.device(linear.kernel)
    packed = None if source.pack_cache is None else source.pack_cache.packed(module, lambda: pack(weight.nibbles, device))
    tensors = int4_tensors(weight, bias, linear.compute_dtype, device, packed)
    if isinstance(linear, Q4KScalesLinear):  # the pairs are made on each call from Q4_K's parts
        del tensors["scales_and_zeros"]
        tensors.update({suffix.removeprefix("."): source.get(module + suffix) for suffix in Q4K_SUFFIXES})
    return tensors


def stored_int4(module: str, source: SafetensorsSource) -> Int4Weight:
    """`module`'s Int4Weight as the checkpoint stores it; where the pack cache keeps its packed
    layout, the nibbles are only a shape (meta): reading them would cost half a byte a weight
    (~0.55 GB for the default target) for nothing."""
    kept = source.pack_cache is not None and source.pack_cache.holds(module)

    def read(name: str) -> torch.Tensor:
        if kept and name.endswith(INT4_SUFFIXES[0]):
            return torch.empty(source.shape(name), dtype=torch.uint8, device="meta")
        return source.get(name)

    return read_int4(read, module)


def fill(module: nn.Module, tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    """Replace `module`'s meta tensors by `tensors` (names relative to module), on `device`."""
    for name, tensor in tensors.items():
        # Never a view of the memory-mapped file (safetensors hands those out), at an address
        # whose alignment changes how CPU kernels round: a cast or a move already made a fresh
        # tensor (copying that again would hold two for a moment: 0.9 GB for a float32 1.5B's
        # embeddings), anything else is copied.
        value = tensor.to(device)
        if value.data_ptr() == tensor.data_ptr():
            value = value.clone()
        set_tensor(module, name, value)


def set_tensor(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """`value` as `module`'s parameter (frozen) or buffer `name` (dotted), whichever it declares."""
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    if leaf in owner._parameters:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value


def fill_resident(model: PreTrainedModel, layers_name: str, source: SafetensorsSource, dtype: torch.dtype,
                  device: torch.device, mapped: frozenset[str] = frozenset()) -> None:
    """Load everything outside the decoder layers: embeddings, final norm, LM head, rotary. The
    parameters named in `mapped` are left as the checkpoint's memory-mapped tensors, as stored (no
    cast, no copy: file pages, not the process's memory), for a preparation to replace."""
    tied = tied_head(model)

    def wanted(name: str) -> bool:  # a module's name ends with ".": its own tensors are not in the checkpoint
        return not name.startswith(layers_name + ".") and name != tied and name not in mapped and \
            (name.endswith(".") or name in source.where)

    fill(model, layer_tensors(model, "", source, dtype, wanted), device)
    for name in mapped - {tied}:
        set_tensor(model, name, source.get(name))
    if model.config.tie_word_embeddings:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    rebuild_computed_buffers(model, device)
    still_empty = [n for n, t in model.state_dict(keep_vars=True).items()
                   if t.is_meta and not n.startswith(layers_name + ".")]
    if still_empty:
        raise SpecchatError(f"the checkpoint lacks tensors this model needs: {', '.join(still_empty[:5])}")


def tied_head(model: PreTrainedModel) -> str | None:
    """The LM head weight's name when it is the input embedding's (tied): a checkpoint that stores
    it anyway need not be read for it."""
    if not model.config.tie_word_embeddings:
        return None
    return module_name(model, model.get_output_embeddings()) + ".weight"


def module_name(model: nn.Module, module: nn.Module) -> str:
    """`module`'s dotted name inside `model`."""
    return next(name for name, candidate in model.named_modules() if candidate is module)


def rebuild_computed_buffers(model: PreTrainedModel, device: torch.device) -> None:
    """Buffers that are computed at construction, never saved (rotary frequencies), are still
    on meta: construct their modules again, for real, on `device`."""
    for name, module in list(model.named_modules()):
        computed = [b for b in module._non_persistent_buffers_set if module._buffers.get(b) is not None]
        if not any(module._buffers[b].is_meta for b in computed):
            continue
        with torch.device(device):
            fresh = type(module)(config=model.config)
        owner_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner_name), leaf, fresh)
