"""Loading the draft model: checked against the target's tokenizer, then approximated."""

import torch
from transformers import PreTrainedTokenizerBase

from specchat.decoding.forward import CausalLM
from specchat.decoding.stopping import stop_token_ids
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.draft_approx import approximate_draft
from specchat.models.loading import load
from specchat.progress import Reporter
from specchat.quant.int8 import int8_pays


def load_draft(spec: str, device: torch.device, dtype: torch.dtype, quantization: object | None,
               target_tokenizer: PreTrainedTokenizerBase, reporter: Reporter, int8: bool,
               vocab_size: int | None) -> CausalLM:
    """The draft `spec` on `device`, its weights in int8 if `int8`, its head scoring the
    `vocab_size` most frequent tokens (None: all); `quantization` loads it through bitsandbytes."""
    draft = load(spec, dtype, reporter.bars, reporter.report, quantization=quantization, device=device)
    check_tokenizers_compatible(draft.tokenizer, target_tokenizer)
    if quantization is None:
        reporter.step(f"moving {draft.name} to {device.type}")
        draft.model.to(device)
    reporter.step(f"preparing the draft ({describe(int8, vocab_size)})")
    return approximate_draft(draft.model, draft.tokenizer, draft.directory, int8, vocab_size,
                             stop_token_ids(draft.model, draft.tokenizer))


def resolve_draft_quant(kind: str, device: torch.device, dtype: torch.dtype) -> str:
    """`auto` is int8 on a CPU where its kernel beats the dense `dtype` matmul there (measured:
    it does without bf16 hardware, it does not with avx512_bf16), and no quantization elsewhere
    (the kernel is CPU-only)."""
    if kind != "auto":
        return kind
    return "int8" if device.type == "cpu" and int8_pays(dtype) else "none"


def describe(int8: bool, vocab_size: int | None) -> str:
    weights = "int8 weights" if int8 else "full weights"
    return f"{weights}, {f'{vocab_size}-token head' if vocab_size else 'whole vocabulary'}"
