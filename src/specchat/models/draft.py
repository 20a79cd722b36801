"""Loading the draft model: checked against the target's tokenizer, then approximated."""

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from specchat.decoding.forward import CausalLM
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.draft_approx import DraftApprox
from specchat.models.loading import load
from specchat.progress import Reporter
from specchat.quant.widths import INT8_ROWS, int8_rows


@dataclass(frozen=True)
class DraftQuant:
    """How the draft's weights are stored, as resolved for this device, and where its input embedding is."""

    kind: str  # none | int8 | int4 | nf4 | dense (a draft stored in 4 bits, expanded) | fp8
    dense_above: int | None = None  # int8: inputs of more rows multiply the dense weights kept beside
    host_embedding: bool = False  # its input embedding held in host RAM beside a GPU, as the plan says

    @property
    def rows(self) -> str:
        """The widths its stored form multiplies, in words ("" where it takes every width)."""
        return "" if self.dense_above is None else f" up to {self.dense_above} rows"

    @property
    def form(self) -> str:
        """How its weights are stored, in words."""
        return f"{self.kind}{self.rows}"

    @property
    def where(self) -> str:
        """Where its input embedding is, in words ("" on the device, with the rest)."""
        return ", its input embedding on the host" if self.host_embedding else ""

    def __str__(self) -> str:
        return f"{self.form}{self.where}"


def load_draft(spec: str, device: torch.device, dtype: torch.dtype, quantization: object | None,
               target_tokenizer: PreTrainedTokenizerBase, reporter: Reporter, quant: DraftQuant,
               vocab_size: int | None) -> CausalLM:
    """The draft `spec` on `device`, its weights as `quant` says, its head scoring the
    `vocab_size` most frequent tokens (None: all), prepared as it loads (models/layerwise.py);
    `quantization` loads it through bitsandbytes."""
    reporter.step(f"loading the draft {spec} ({describe(quant, vocab_size)})")
    approx = approximation(quant, vocab_size, dtype, device)
    draft = load(spec, dtype, reporter.bars, reporter.report, quantization=quantization, device=device,
                 preparation=approx, tokenizer=target_tokenizer)
    if draft.tokenizer is not target_tokenizer:  # else its files are the target's
        check_tokenizers_compatible(draft.tokenizer, target_tokenizer)
    if quantization is None:
        draft.model.to(device)  # loaded straight onto it, unless transformers loaded a GGUF
    return approx.draft(draft.model)


def approximation(quant: DraftQuant, vocab_size: int | None, dtype: torch.dtype, device: torch.device) -> DraftApprox:
    """How a draft stored as `quant` is prepared as it loads, its head scoring `vocab_size` tokens."""
    return DraftApprox(quant.kind == "int8", vocab_size, quant.dense_above, dtype=dtype, int4=quant.kind == "int4",
                       device=device, expand=quant.kind in ("dense", "fp8"), host_embedding=quant.host_embedding,
                       fp8=quant.kind == "fp8")


def resolve_draft_quant(kind: str, device: torch.device, dtype: torch.dtype) -> DraftQuant:
    """`auto` is int8 on a CPU for the input widths where its kernel beats the dense `dtype`
    matmul there (measured: at every width with x86's dynamic kernel or without bf16 hardware;
    with avx512_bf16 and the weight-only kernel only up to a few rows, so wider draft steps keep
    the dense weights), and no quantization elsewhere (the kernels are CPU-only). Measured once
    per machine and kept (quant/widths.py: measured at every startup, it flipped). An explicit
    kind is taken as it is: int8 at every width."""
    if kind != "auto":
        return DraftQuant(kind)
    rows = int8_rows(dtype) if device.type == "cpu" else 0
    if rows == 0:
        return DraftQuant("none")
    return DraftQuant("int8", None if rows == INT8_ROWS[-1] else rows)


def describe(quant: DraftQuant, vocab_size: int | None) -> str:
    """The draft's form for the loading step: its weights, where its input embedding is, its head."""
    weights = {"none": "full weights", "dense": "4-bit weights expanded"}.get(quant.kind, f"{quant.kind} weights")
    return f"{weights}{quant.rows}{quant.where}, {f'{vocab_size}-token head' if vocab_size else 'whole vocabulary'}"
