"""Converting a GGUF file, once, into a float32 safetensors directory that reloads in well under a second.

Loading a GGUF dequantizes every tensor (15-40 s); the directory written here holds exactly those
dequantized float32 values, so loading it later gives the same model without paying that again.
"""

import os
import shutil
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer, PreTrainedModel

from specchat.diskspace import check_free_space, disk_full_is_one_line
from specchat.models.gguf_model import gguf_model
from specchat.models.marker import write_marker
from specchat.models.staging import new_temp_dir
from specchat.progress import Reporter, transformers_bars


def convert(gguf: Path, target: Path, source_sha256: str, reporter: Reporter) -> None:
    """Write the converted model to a temporary directory, then rename it to `target` in one step."""
    temp = new_temp_dir(target)
    try:
        write_converted(gguf, temp, reporter)
        write_marker(temp, provenance(source_sha256))
        os.rename(temp, target)
    except BaseException:
        shutil.rmtree(temp)  # a half-converted directory is useless and large
        raise


def write_converted(gguf: Path, directory: Path, reporter: Reporter) -> None:
    stage = f"converting {gguf.stem}"
    with reporter.bar(total=4, desc=stage, unit="step", postfix="tokenizer") as bar, \
            transformers_bars(reporter, lambda desc: f"{stage}: {desc.lower()}"):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str("dequantizing")
        model = gguf_model(gguf, torch.float32)
        bar.update()
        bar.set_postfix_str("saving weights")
        make_serializable(model)
        needed = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
        what = f"the converted {gguf.stem}"
        check_free_space(directory, needed, what)
        with disk_full_is_one_line(directory, needed, what):
            model.save_pretrained(directory)
            bar.update()
            bar.set_postfix_str("saving tokenizer")
            tokenizer.save_pretrained(directory)
        bar.update()


def make_serializable(model: PreTrainedModel) -> None:
    """transformers refuses to save a GGUF-loaded model; its weights are already plain tensors, so
    dropping the GGUF quantization record is all it takes (design.md section 3). A Mixtral, built
    from its state dict (models/gguf_model.py), has none."""
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None


def provenance(source_sha256: str) -> dict[str, str]:
    return {
        "source_sha256": source_sha256,
        "dtype": "float32",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
