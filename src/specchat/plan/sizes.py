"""What a model built on the meta device holds, in bytes: its decoder layers (as the layer file
lays them out) and the parts outside them. The plan (`plan/budget.py`) adds the rest."""

import torch
from transformers import PreTrainedModel

from specchat.plan.demand import tensor_bytes
from specchat.offload.direct_io import align_up
from specchat.checkpoint.layout import LayerLayout
from specchat.plan.placement import ModelSizes


def measure_sizes(model: PreTrainedModel, layers_name: str, layouts: list[LayerLayout], dtype: torch.dtype) -> ModelSizes:
    """`model` on the meta device; headroom 0 (the plan counts caches, activations and the draft)."""
    seen, outside = set(), 0
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) not in seen and not name.startswith(layers_name + "."):
            outside += tensor_bytes(tensor, dtype)
        seen.add(id(tensor))
    layers = tuple(layout.nbytes for layout in layouts)
    heads = tuple(layout.head for layout in layouts) if any(layout.units for layout in layouts) else ()
    return ModelSizes(layers, outside, 0, sum(align_up(size) for size in layers), heads)


def host_embedding_bytes(model: PreTrainedModel, dtype: torch.dtype) -> int:
    """Bytes of `model`'s input embedding (on the meta device) that a target on a GPU holds on the
    host (offload/host_embedding.py), counted as `measure_sizes` counts them among the fixed parts;
    none where the LM head is tied to it."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    tensors = [*embedding.parameters(), *embedding.buffers()]
    if head is not None and any(tensor is getattr(head, "weight", None) for tensor in tensors):
        return 0
    return sum(tensor_bytes(tensor, dtype) for tensor in tensors)
