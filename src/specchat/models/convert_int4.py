"""Converting a GGUF file's Q4_K linears and token embedding, once, into the packed int4 form the
target multiplies (and looks its embeddings up in: quant/int4_embedding.py).

The dense conversion (models/convert.py) expands every tensor to float32; this one keeps the linears
and the embedding that the GGUF stores as Q4_K in 4 bits. The directory it writes holds:
  int4.safetensors   for each such tensor's module, its Int4Weight (quant/int4_weight.py):
                       <module>.int4_nibbles uint8 [O, I/2], <module>.int4_scales and
                       <module>.int4_zeros float32 [G, O] (groups of 32), and for a linear
                       Q4_K's own scale parts (quant/q4k_scales.py): <module>.q4k_sc, .q4k_m
                       uint8 [G, O], .q4k_d, .q4k_dmin fp16 [G/8, O]
                     and, for each Q6_K linear (the LM head, layers' down and v projections), its
                     Q6Weight (quant/q6k.py): <module>.q6_values int8 [O, I], <module>.q6_scales
                     int8 [O, I/16], <module>.q6_d float32 [O, I/256]
                     and a MoE layer's stacked experts, each expert's linears in these forms under
                     the split model's names (models/convert_experts.py)
  *.safetensors      links to the dense conversion's files, for every other tensor (norms,
                     biases, and the dense form of the Q6_K linears and LM head, which no 4-bit
                     kernel takes: a run multiplies them so unless its plan keeps them compact)
  config.json, the tokenizer's files, and the completion marker.
Every Int4Weight is checked as it is written against the dense conversion's tensor, which
transformers dequantized itself: bitwise, or within the bound gguf_int4 states for blocks whose d
and dmin are far apart. A tensor that transformers reorders as it loads (Llama's q and k) fails
that check and stays dense, so the packed model always holds the dense model's weights.
"""

import os
import shutil
from pathlib import Path

import torch
import transformers
from gguf import GGMLQuantizationType, GGUFReader
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

from specchat.checkpoint.skeleton import module_name
from specchat.checkpoint.sources import SafetensorsSource
from specchat.diskspace import check_free_space, disk_full_is_one_line
from specchat.models.convert_experts import expert_tensors
from specchat.models.gguf_mixtral import mixtral_names
from specchat.models.marker import INT4_FORMAT, write_marker
from specchat.models.staging import new_temp_dir
from specchat.progress import Reporter
from specchat.quant.gguf_int4 import matches, q4k_to_int4
from specchat.quant.int4 import int4_fits
from specchat.quant.int4_checkpoint import INT4_FILE, int4_entries, int4_modules
from specchat.quant.q4k_scales import q4k_entries
from specchat.quant.q6k import q6_entries, q6_modules, q6k_to_weight

CPU = torch.device("cpu")


def convert_int4(gguf: Path, dense: Path, target: Path, reporter: Reporter) -> None:
    """Write the packed conversion of `gguf` (whose dense conversion is `dense`) to a temporary
    directory, then rename it to `target` in one step."""
    temp = new_temp_dir(target)
    try:
        count = write_int4(gguf, dense, temp, reporter)
        link_dense(dense, temp)
        write_marker(temp, {"source": str(dense), "int4_tensors": str(count), "format": INT4_FORMAT,
                            "transformers": transformers.__version__, "torch": torch.__version__})
        os.rename(temp, target)
    except BaseException:
        shutil.rmtree(temp)  # a half-converted directory is useless
        raise


def write_int4(gguf: Path, dense: Path, directory: Path, reporter: Reporter) -> int:
    """int4.safetensors of the Q4_K token embedding and every Q4_K linear that the kernels take
    (with the linears' Q4_K scale parts), and every Q6_K linear, each that matches its dense
    tensor; returns how many modules it holds."""
    config = AutoConfig.from_pretrained(dense)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    reader = GGUFReader(gguf)
    names = hf_names(model, str(reader.fields["general.architecture"].contents()))
    linears = {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    embedding = module_name(model, model.get_input_embeddings())
    source = SafetensorsSource(dense)
    tensors: dict[str, Tensor] = {}
    candidates = [t for t in reader.tensors
                  if t.tensor_type == GGMLQuantizationType.Q4_K and names.get(t.name, "").endswith(".weight")]
    with reporter.bar(total=len(candidates), desc=f"packing {gguf.stem} in 4 bits", unit="tensor") as bar:
        for tensor in candidates:
            module = names[tensor.name].removesuffix(".weight")
            linear = linears.get(module)
            if module == embedding or linear is not None and int4_fits(linear.in_features, linear.out_features, 32, CPU):
                weight = q4k_to_int4(tensor.data)
                if matches(weight, source.get(names[tensor.name])):
                    tensors.update(int4_entries(module, weight))
                    if linear is not None:  # for layers streamed compact (quant/q4k_scales.py)
                        tensors.update(q4k_entries(module, tensor.data))
            bar.update()
    tensors.update(q6_tensors(model, reader, names, source))
    tensors.update(expert_tensors(reader, names, source))
    needed = sum(t.numel() * t.element_size() for t in tensors.values())
    check_free_space(directory, needed, f"the 4-bit {gguf.stem}")
    with disk_full_is_one_line(directory, needed, f"the 4-bit {gguf.stem}"):
        save_file(tensors, str(directory / INT4_FILE))
        config.save_pretrained(directory)
        for path in dense.iterdir():
            if path.suffix != ".safetensors" and path.name not in ("config.json", "model.safetensors.index.json") \
                    and path.is_file() and not path.name.startswith("specchat-"):
                shutil.copy2(path, directory / path.name)  # the tokenizer's files
    return len(int4_modules(tensors)) + len(q6_modules(tensors))


def q6_tensors(model: PreTrainedModel, reader: GGUFReader, names: dict[str, str],
               source: SafetensorsSource) -> dict[str, Tensor]:
    """Each Q6_K linear (the LM head, a layer's down or v projection) as a Q6Weight (quant/q6k.py)
    when it is the dense conversion's bitwise: for plans that stream layers, or are short of
    memory for the head, to choose (plan/budget.py)."""
    linears = {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    tensors: dict[str, Tensor] = {}
    for tensor in reader.tensors:
        module = names.get(tensor.name, "").removesuffix(".weight")
        if tensor.tensor_type != GGMLQuantizationType.Q6_K or module not in linears:
            continue
        weight = q6k_to_weight(tensor.data)
        if torch.equal(weight.dequantize(), source.get(module + ".weight")):
            tensors.update(q6_entries(module, weight))
    return tensors


def hf_names(model: PreTrainedModel, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's state_dict name, as transformers maps them when it loads a
    file of that `architecture` (general.architecture: its processor, which maps a MoE model's
    stacked `blk.N.ffn_gate_exps` and `ffn_up_exps`, with no suffix, to its fused gate_up_proj,
    is looked up by it, not by the model type; llama.cpp's Mixtral, a `llama` file, as
    models/gguf_mixtral.py maps it)."""
    if model.config.model_type == "mixtral":
        return mixtral_names(model)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    return get_gguf_hf_weights_map(model, processor)


def link_dense(dense: Path, directory: Path) -> None:
    """The dense conversion's safetensors, linked (not copied: gigabytes) beside int4.safetensors;
    the packed linears' dense `.weight` tensors in them are never read."""
    for path in sorted(dense.glob("*.safetensors")):
        os.symlink(path, directory / path.name)
