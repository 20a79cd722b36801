"""A draft loaded whole, approximated as the app approximates one as it loads (models/draft_approx.py,
models/layerwise.py): the tests' way to a prepared draft from a model they already hold."""

from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specchat.decoding.forward import CausalLM
from specchat.models.draft_approx import DraftApprox


def approximate_draft(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path, int8: bool,
                      vocab_size: int | None, stop_ids: frozenset[int], dense_above: int | None = None,
                      int4: bool = False) -> CausalLM:
    """`model` as a draft approximated as `DraftApprox` says, its head first, then its layers one at
    a time (a float32 1.5B's stacks alone are 3.4 GB); its ranking read from or stored in `directory`."""
    approx = DraftApprox(int8, vocab_size, dense_above, stop_ids, model.get_input_embeddings().weight.dtype, int4=int4)
    approx.prepare_head(model, tokenizer, directory)
    return approx.prepared(model)
