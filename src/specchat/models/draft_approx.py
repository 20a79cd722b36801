"""The draft's approximations. SpecExec's verification reads only the target's distributions, so
the draft may be approximated freely: a worse draft grows a worse tree (fewer tokens accepted),
never a different output.

- int8: every linear of the decoder layers and the LM head, and the input embedding's rows, in
  int8 (quant/int8.py), on a CPU,
  where fbgemm's dynamic kernel (x86) multiplies faster than bf16 at every width, and the
  weight-only kernel reads a quarter of fp32's bytes. A layer's q/k/v projections, and its
  gate/up projections, run as one product each (quant/stacked.py).
- int4: the decoder layers' linears rounded to 4 bits in groups (quant/int4_rtn.py), packed for the
  device they load onto and run as a 4-bit target's are: a quarter of bf16's bytes on any device.
- fp8: the decoder layers' linears (a draft stored in 4 bits, expanded first) in 8-bit floats with a
  scale a row, multiplied by fp8 matrix units (quant/fp8.py): half of bf16's bytes and, on GPUs
  that have them, twice its matrix rate.
- sub-vocabulary head (FR-Spec): the LM head scores only the `vocab_size` most frequent tokens
  (models/vocab_rank.py) and the stop tokens; the head's share of a draft step shrinks by
  vocab / vocab_size. The draft can then never propose a rarer token. The whole head, never read
  again, is let go (tied to the input embedding, its weight stays as that).

A `DraftApprox` prepares a model as it loads (models/layerwise.py fills one decoder layer at a
time and hands each over), so that only one layer's dense weights exist at once beside the int8 ones.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specchat.checkpoint.skeleton import module_name
from specchat.decoding.forward import CausalLM
from specchat.decoding.stopping import stop_token_ids
from specchat.models.draft_attention import replace_attention
from specchat.models.fused_norms import fuse_norms
from specchat.models.vocab_rank import head_vocab, vocab_ranking
from specchat.offload.host_embedding import keep_embedding_on_host
from specchat.quant.fp8 import fp8_linears
from specchat.quant.int4 import use_registers
from specchat.quant.int4_dense import expand_linears
from specchat.quant.int4_rtn import round_linears
from specchat.quant.int8 import Int8Embedding, Int8Linear, dense_linear, quantize_linears
from specchat.quant.stacked import stack_projections


class DroppedHead(nn.Module):
    """Stands where a draft's whole LM head stood once its sub-vocabulary head replaced it."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this draft scores a sub-vocabulary: its whole LM head was let go (CausalLM.head scores)")


@dataclass
class DraftApprox:
    """How a draft is approximated: int8 linears (inputs of more than `dense_above` rows keep the
    dense weights, when set) or (`int4`) its decoder layers' linears rounded to 4 bits, or
    (`expand`) its stored 4-bit linears expanded to dense ones; a head of the `vocab_size` most
    frequent tokens and the stop tokens (`stop_ids`; None: the model's) or,
    with None or the whole vocabulary, of every token."""

    int8: bool
    vocab_size: int | None
    dense_above: int | None = None
    stop_ids: frozenset[int] | None = None
    dtype: torch.dtype | None = None  # the draft's; None: its weights' as they reach prepare_head
    vocab: torch.Tensor | None = None  # set by prepare_head when the head scores a sub-vocabulary
    head: nn.Module | None = None
    int4: bool = False
    device: torch.device | None = None  # int4: the device its linears are packed for; None: where each layer's weights are
    expand: bool = False
    host_embedding: bool = False  # beside a GPU, its (untied) input embedding held in host RAM, as planned
    fp8: bool = False  # its decoder's linears in fp8 (quant/fp8.py), after any expansion and stacking

    def mapped(self, model: PreTrainedModel) -> frozenset[str]:
        """Under int8 the input embedding and the LM head are replaced by int8 copies (or a
        sub-vocabulary's rows): they are read straight from the checkpoint's file, a block of rows
        at a time, never whole in the model's dtype."""
        if not self.int8:
            return frozenset()
        return frozenset(module_name(model, module) + ".weight"
                         for module in (model.get_input_embeddings(), model.get_output_embeddings()))

    def on_host(self, model: PreTrainedModel) -> frozenset[str]:
        """An input embedding held on the host is read from the checkpoint there, never onto the device."""
        if not self.host_embedding:
            return frozenset()
        return frozenset({module_name(model, model.get_input_embeddings()) + ".weight"})

    def prepare_head(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
        """The LM head as the draft scores with it, its tokens ranked on `tokenizer` (the ranking
        read from, or stored once in, `directory`): before the decoder layers load, so that a
        whole head let go is gone before they arrive."""
        full = model.config.vocab_size
        dtype = self.dtype or model.get_input_embeddings().weight.dtype
        if self.int8:
            self.prepare_embedding(model, dtype)
        if self.host_embedding:
            self.hold_embedding_on_host(model, dtype)
        if self.vocab_size is None or self.vocab_size >= full:
            if self.int8:
                weight = model.get_output_embeddings().weight.detach()
                model.set_output_embeddings(Int8Linear(weight, None, self.dense_above, dtype=dtype))
            return
        stop_ids = self.stop_ids if self.stop_ids is not None else stop_token_ids(model, tokenizer)
        # a tokenizer may add a stop token past the model's rows (a Qwen2 tokenizer's <|endoftext|>
        # over a smaller vocabulary): no row of the head scores it, so the model never emits it
        scored = sorted(token for token in stop_ids if token < full)
        self.vocab = head_vocab(vocab_ranking(directory, tokenizer, full), self.vocab_size, scored)
        self.head = sub_head(model, self.vocab, self.int8, self.dense_above, dtype)
        model.set_output_embeddings(DroppedHead())

    @staticmethod
    def prepare_embedding(model: PreTrainedModel, dtype: torch.dtype) -> None:
        """The input embedding in int8 rows, looked up in `dtype`; a head tied to it keeps the
        dense weight until the head is prepared from it."""
        embedding = model.get_input_embeddings()
        if isinstance(embedding, nn.Embedding):
            model.set_input_embeddings(Int8Embedding(embedding.weight.detach(), dtype))

    def hold_embedding_on_host(self, model: PreTrainedModel, dtype: torch.dtype) -> None:
        """The input embedding in `dtype` in host RAM, looked up there (offload/host_embedding.py):
        a step reads one row a token, and its bytes on the card hold target layers instead. A
        static step copies the rows it looks up into its buffers (decoding/static_step.py)."""
        embedding = model.get_input_embeddings()
        embedding.weight = nn.Parameter(embedding.weight.detach().to("cpu", dtype, copy=True), requires_grad=False)
        keep_embedding_on_host(model, self.device or torch.device("cpu"), dtype)

    def prepare_layer(self, layer: nn.Module) -> None:
        """One decoder layer's stored 4-bit linears expanded under `expand`; its projections stacked
        and, under int8, its linears in int8; under int4 its linears rounded to 4 bits, packed for
        `device` (a layer loaded on a CPU moves there later); under fp8 its linears in fp8, last.
        On CUDA every form's projections are stacked, 4-bit ones too, its queries and keys rotated
        together and its norms fused: a captured step is bound by its kernels' count, a narrow
        product's few programs and the bytes it moves (quant/stacked.py, draft_attention.py,
        fused_norms.py; its grouped attention packed as every model's is, bounded_attention.py); on
        a CPU only int8's projections are stacked, where that was measured (a small gain)."""
        if self.expand:
            expand_linears(layer)
        if self.int8:
            stack_projections(layer)
            quantize_linears(layer, self.dense_above)
        if self.int4:
            weight = next(layer.parameters())
            round_linears(layer, self.dtype or weight.dtype, self.device or weight.device)
        if self.on_cuda():
            stack_projections(layer, packed=True)
            replace_attention(layer)
            fuse_norms(layer)
        if self.fp8:  # after stacking: one fp8 product a stack
            fp8_linears(layer)

    def on_cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def prepared(self, model: PreTrainedModel) -> CausalLM:
        """`model`, loaded whole (its head already prepared where that matters), as the draft: each
        decoder layer prepared, then `draft`."""
        for layer in model.get_decoder().layers:
            self.prepare_layer(layer)
        return self.draft(model)

    def draft(self, model: PreTrainedModel) -> CausalLM:
        use_registers(model)  # its 4-bit linears, stored so or rounded (CUDA: int4_gemm where it is faster)
        if self.on_cuda():
            fuse_norms(model.get_decoder())  # the final norm (its layers' are fused as they load)
        return CausalLM(model, vocab=self.vocab, head=self.head)


def approximate_draft(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path, int8: bool,
                      vocab_size: int | None, stop_ids: frozenset[int], dense_above: int | None = None,
                      int4: bool = False) -> CausalLM:
    """`model`, loaded whole, as a draft approximated as `DraftApprox` says (its layers one at a
    time: a float32 1.5B's stacks alone are 3.4 GB)."""
    approx = DraftApprox(int8, vocab_size, dense_above, stop_ids, model.get_input_embeddings().weight.dtype, int4=int4)
    approx.prepare_head(model, tokenizer, directory)
    return approx.prepared(model)


def sub_head(model: PreTrainedModel, vocab: torch.Tensor, int8: bool, dense_above: int | None,
             dtype: torch.dtype) -> nn.Module:
    """The LM head's rows for `vocab`, in `dtype` (a copy: the embedding it may be tied to stays whole)."""
    weight = model.get_output_embeddings().weight.detach()
    rows = weight[vocab.to(weight.device)].to(dtype)
    if int8:
        return Int8Linear(rows, None, dense_above)
    return dense_linear(rows)
