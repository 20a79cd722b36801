"""Turning a model spec (alias, local directory, .gguf file or hub id) into a model and tokenizer."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specchat.bounded_attention import bound_attention
from specchat.errors import SpecchatError
from specchat.models.compat import same_tokenizer_files
from specchat.models.embedded import ensure_embedded
from specchat.models.gguf_model import gguf_model
from specchat.models.hub import download
from specchat.models.layerwise import Preparation, load_layer_by_layer, prepare_loaded
from specchat.models.spec import ModelSource, resolve
from specchat.offload.build import Offload, offload_model
from specchat.offload.placement import Placement
from specchat.progress import Report, Reporter, transformers_bars
from specchat.quant.awq import read_awq_spec
from specchat.quant.gptq import read_gptq_spec
from specchat.quant.int4_checkpoint import INT4_FILE

@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    source: ModelSource
    directory: Path  # where its files are (the converted copy for an embedded model or a .gguf)


def load(spec: str, dtype: torch.dtype, progress: bool = True, report: Report | None = None,
         quantization: object | None = None, device: torch.device | None = None, weights: str = "dense",
         preparation: Preparation | None = None, tokenizer: PreTrainedTokenizerBase | None = None,
         compact_head: bool = False, compact_layers: bool = False) -> LoadedModel:
    """Load `spec` for inference: eval mode, gradients off, SDPA attention.

    `progress` draws bars on stderr; `report`, if given, also receives every step and fraction.
    A `quantization` config (bitsandbytes) loads the weights quantized, straight onto `device`.
    `weights` quantized (--weights, decided) loads an embedded model from its 4-bit weights
    (`has_int4`), packed for `device`; dense, from their dense conversion.
    A `preparation` (the draft's approximations) is applied as the model loads: a safetensors
    checkpoint is then read one decoder layer at a time, straight onto `device`.
    A `tokenizer` already loaded from byte-identical files (models/compat.py) is used again.
    `compact_head` keeps a 4-bit checkpoint's Q6_K LM head so (quant/q6k_linear.py), `compact_layers`
    its decoder layers' Q6_K linears and Q4_K scales (quant/q4k_scales.py).
    """
    source = resolve(spec)
    reporter = Reporter(progress, report)
    reporter.step(f"loading {source.name}")
    directory, gguf_file = materialize(source, reporter, weights)
    if gguf_file is not None or reused_tokenizer(tokenizer, directory) is None:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    if gguf_file is None and (is_packed_4bit(directory) or is_int4(directory)):
        # 4-bit weights through torch's own int4 kernels (transformers would need optimum and a
        # GPTQ or AWQ kernel library, and expands a GGUF's).
        model, _ = offload_model(directory, source.name, dtype, device or torch.device("cpu"), None, None, reporter,
                                 compact_head=compact_head, compact_layers=compact_layers,
                                 on_host=None if preparation is None else preparation.on_host)
        if preparation is not None:
            prepare_loaded(model, tokenizer, directory, preparation)
        return LoadedModel(model, tokenizer, source.name, source, directory)
    if preparation is not None and gguf_file is None and quantization is None:
        model = load_layer_by_layer(directory, tokenizer, dtype, device or torch.device("cpu"), preparation, reporter)
        return LoadedModel(model.eval(), tokenizer, source.name, source, directory)
    options = {} if quantization is None else {"quantization_config": quantization, "device_map": {"": device}}
    with transformers_bars(reporter, lambda desc: f"loading {source.name} weights"):
        if gguf_file is not None:  # with the config the file declares (models/gguf_model.py)
            model = gguf_model(directory / gguf_file, dtype, attn_implementation="sdpa", **options)
        else:
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="sdpa", **options)
    model.eval()
    model.requires_grad_(False)
    own_aligned_weights(model)
    bound_attention(model)  # as a skeleton's (checkpoint/skeleton.py)
    if preparation is not None:
        prepare_loaded(model, tokenizer, directory, preparation)
    return LoadedModel(model, tokenizer, source.name, source, directory)


def reused_tokenizer(tokenizer: PreTrainedTokenizerBase | None, directory: Path) -> PreTrainedTokenizerBase | None:
    """`tokenizer` when it was loaded from files byte-identical to `directory`'s, else None."""
    if tokenizer is None or not same_tokenizer_files(Path(tokenizer.name_or_path), directory):
        return None
    return tokenizer


def load_tokenizer(spec: str, progress: bool = True, report: Report | None = None) -> PreTrainedTokenizerBase:
    """Only the tokenizer of `spec` (the weights are fetched or assembled if they are not local)."""
    source = resolve(spec)
    directory, gguf_file = materialize(source, Reporter(progress, report))
    return AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)


def own_aligned_weights(model: PreTrainedModel) -> None:
    """Copy weights that are still views of the memory-mapped checkpoint into fresh memory.

    safetensors places tensors at 8-byte-aligned file offsets; CPU matmul kernels round
    differently on such addresses than on the allocator's 64-byte-aligned ones (~1e-7 relative),
    so without this the same weights give slightly different logits in memory and offloaded.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.device.type == "cpu" and parameter.data_ptr() % 64:
                parameter.data = parameter.data.clone()


def load_offloaded(spec: str, dtype: torch.dtype, device: torch.device, placement: Placement, offload_dir: Path,
                   reporter: Reporter, weights: str = "dense", tokenizer: PreTrainedTokenizerBase | None = None,
                   compact_head: bool = False, compact_layers: bool = False) -> tuple[LoadedModel, Offload]:
    """Load `spec` with its decoder layers where `placement` (the memory plan's) puts them, the
    layer file in `offload_dir` (see specchat.offload); `weights`, `tokenizer`, `compact_head` and
    `compact_layers`: as `load`."""
    source = resolve(spec)
    tiers = f"{placement.resident} resident, {placement.ram} in RAM, {placement.disk} on disk"
    reporter.step(f"loading {source.name}, decoder layers offloaded ({tiers})")
    directory, gguf_file = materialize(source, reporter, weights)
    if gguf_file is not None:
        raise SpecchatError(
            f"offloading reads safetensors checkpoints, and {source.name} is a .gguf file: "
            "use a model directory or hub id (the embedded models are converted automatically)"
        )
    tokenizer = reused_tokenizer(tokenizer, directory) or AutoTokenizer.from_pretrained(directory)
    model, offload = offload_model(directory, stored_name(source, weights), dtype, device, placement, offload_dir,
                                   reporter, compact_head, compact_layers)
    return LoadedModel(model, tokenizer, source.name, source, directory), offload


def stored_name(source: ModelSource, weights: str) -> str:
    """The name `source`'s layer file goes by: its 4-bit (`weights` quantized) and dense forms each
    have their own."""
    return f"{source.name}-int4" if weights == "quantized" else source.name


def is_int4(directory: Path) -> bool:
    """True when the checkpoint holds Int4Weights beside its dense tensors (models/convert_int4.py)."""
    return (directory / INT4_FILE).is_file()


def has_int4(source: ModelSource) -> bool:
    """Whether `source` can be run from 4-bit weights that it stores as they are: an embedded
    model (its GGUF's Q4_K linears). GPTQ and AWQ checkpoints always run so."""
    return source.kind == "embedded"


def is_packed_4bit(directory: Path) -> bool:
    """True when the checkpoint holds GPTQ or AWQ packed 4-bit weights (config.json says so; an AWQ
    or GPTQ variant specchat cannot read is one SpecchatError line)."""
    config = json.loads((directory / "config.json").read_text())
    return read_gptq_spec(config) is not None or read_awq_spec(config) is not None


def materialize(source: ModelSource, reporter: Reporter, weights: str = "dense") -> tuple[Path, str | None]:
    """A local directory to load from (the 4-bit one when `weights` is quantized), and the GGUF
    file name inside it (None for safetensors)."""
    if weights == "quantized" and not has_int4(source):
        raise SpecchatError(f"--weights quantized runs a model from the 4-bit weights it stores, and {source.name} "
                            "stores none that specchat multiplies packed: use --weights dense")
    if source.kind == "embedded":
        return ensure_embedded(source.location, reporter.bars, reporter.report, weights), None
    if source.kind == "hub":
        return download(source.location, reporter.bars), None
    path = Path(source.location)
    if source.kind == "gguf":
        return path.parent, path.name
    return path, None
