"""The draft's approximations. SpecExec's verification reads only the target's distributions, so
the draft may be approximated freely: a worse draft grows a worse tree (fewer tokens accepted),
never a different output.

- int8: every linear of the decoder layers and the LM head in int8 (quant/int8.py), on a CPU,
  where fbgemm's dynamic kernel (x86) multiplies faster than bf16 at every width, and the
  weight-only kernel reads a quarter of fp32's bytes. A layer's q/k/v projections, and its
  gate/up projections, run as one product each (quant/stacked.py).
- sub-vocabulary head (FR-Spec): the LM head scores only the `vocab_size` most frequent tokens
  (models/vocab_rank.py) and the stop tokens; the head's share of a draft step shrinks by
  vocab / vocab_size. The draft can then never propose a rarer token.
"""

from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specchat.decoding.forward import CausalLM
from specchat.models.vocab_rank import head_vocab, vocab_ranking
from specchat.quant.int8 import Int8Linear, dense_linear, quantize_linears
from specchat.quant.stacked import stack_projections


def approximate_draft(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path, int8: bool,
                      vocab_size: int | None, stop_ids: frozenset[int], dense_above: int | None = None) -> CausalLM:
    """`model` as a draft: its decoder linears in int8 if `int8`, the projections of one input
    stacked (inputs of more than `dense_above` rows keep multiplying the dense weights, when set),
    its head restricted to the `vocab_size` most frequent tokens and the stop tokens unless
    `vocab_size` is None or covers the whole vocabulary. The ranking is read from (or stored
    once in) `directory`."""
    if int8:
        # layer by layer: the stacked copies of one layer's weights exist at once, not the model's
        # (a float32 1.5B's stacks alone are 3.4 GB)
        for layer in model.get_decoder().layers:
            stack_projections(layer)
            quantize_linears(layer, dense_above)
    full = model.config.vocab_size
    if vocab_size is None or vocab_size >= full:
        if int8:
            model.set_output_embeddings(Int8Linear(model.get_output_embeddings().weight.detach(), None, dense_above))
        return CausalLM(model)
    vocab = head_vocab(vocab_ranking(directory, tokenizer, full), vocab_size, sorted(stop_ids))
    return CausalLM(model, vocab=vocab, head=sub_head(model, vocab, int8, dense_above))


def sub_head(model: PreTrainedModel, vocab: torch.Tensor, int8: bool, dense_above: int | None) -> nn.Module:
    """The LM head's rows for `vocab` (a copy: the embedding it may be tied to stays whole)."""
    weight = model.get_output_embeddings().weight.detach()
    rows = weight[vocab.to(weight.device)].clone()
    if int8:
        return Int8Linear(rows, None, dense_above)
    return dense_linear(rows)
