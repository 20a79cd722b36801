"""Loading a safetensors checkpoint one decoder layer at a time, each handed to a preparation
(the draft's int8 and stacking) as soon as it is filled.

transformers' `from_pretrained` holds the whole model in the loading dtype before anything can be
prepared: for the embedded 0.5B draft that is 1 GB of bf16 read from a 2.5 GB float32 file, then
its int8 copies beside it, and the freed dense tensors stay on the heap. Built on the meta device
and filled layer by layer, the model never holds more than its prepared layers and one dense one.
"""

from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from transformers import AutoConfig, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from specchat.checkpoint.skeleton import build_skeleton, decoder_layers, fill, fill_resident, layer_tensors, set_tensor
from specchat.checkpoint.sources import SafetensorsSource
from specchat.heap_trim import release_free_heap
from specchat.progress import Reporter

GENERATION_FILE = "generation_config.json"


class Preparation(Protocol):
    """What happens to a model as it loads: its head once the parts outside the decoder layers
    are in, then each decoder layer as soon as it is filled. The parameters it names in `mapped` (on
    a CPU) and `on_host` (beside a GPU) reach `prepare_head` as the checkpoint's memory-mapped
    tensors, in the file's dtype, on the host, for it to replace (those it keeps are then copied in
    the model's dtype)."""

    def mapped(self, model: PreTrainedModel) -> frozenset[str]: ...

    def on_host(self, model: PreTrainedModel) -> frozenset[str]: ...

    def prepare_head(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None: ...

    def prepare_layer(self, layer: nn.Module) -> None: ...


def load_layer_by_layer(directory: Path, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype, device: torch.device,
                        preparation: Preparation, reporter: Reporter) -> PreTrainedModel:
    """The model in `directory` on `device`, floating weights in `dtype`, prepared as it loads."""
    source = SafetensorsSource(directory)
    model = build_skeleton(AutoConfig.from_pretrained(directory), source, dtype)
    if (directory / GENERATION_FILE).is_file():  # its stop tokens, as from_pretrained reads them
        model.generation_config = GenerationConfig.from_pretrained(directory)
    layers_name, layers = decoder_layers(model)
    mapped = (preparation.mapped(model) if device.type == "cpu" else frozenset()) | preparation.on_host(model)
    fill_resident(model, layers_name, source, dtype, device, mapped)
    views = {name: model.get_parameter(name) for name in mapped}
    preparation.prepare_head(model, tokenizer, directory)
    own_kept_views(model, views, dtype)
    for index, layer in enumerate(layers):
        reporter.step(f"loading and preparing layer {index + 1}/{len(layers)}", (index + 1) / len(layers))
        fill(layer, layer_tensors(layer, f"{layers_name}.{index}.", source, dtype), device)
        preparation.prepare_layer(layer)
        # the layer's dense tensors went back to glibc's heap between int8 ones that stay; unless
        # handed back now they pile up layer after layer (measured: +0.2 GB over the 0.5B's 24)
        release_free_heap()
    return model.requires_grad_(False)


def own_kept_views(model: PreTrainedModel, views: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Copy, in `dtype`, each memory-mapped parameter a preparation kept."""
    held = dict(model.named_parameters(remove_duplicate=False))
    for name, view in views.items():
        if name in held and held[name] is view:
            set_tensor(model, name, view.to(dtype, copy=True))


def prepare_loaded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path,
                   preparation: Preparation) -> None:  # nothing is mapped: the model is loaded
    """A model loaded whole, prepared as `load_layer_by_layer` prepares one as it loads."""
    preparation.prepare_head(model, tokenizer, directory)
    for layer in decoder_layers(model)[1]:
        preparation.prepare_layer(layer)
