"""A target's input embedding held in host RAM beside a GPU: looked up there, its rows copied over.

A pass reads one row of the embedding a token, so holding the table on the device buys nothing
but its bytes: Llama 3's 128256 x 8192 in bf16 is 2.1 GB, 4-5 of a 4-bit 70B's 0.46 GB layers a
24 GB card could hold resident instead of streaming them every pass. Looked up on the host, a
1024-token tree's rows are 16 MB to move (under a millisecond at PCIe 4's 25 GB/s); llama.cpp
keeps its token embeddings in host memory for the same reason. The memory plan counts the table
on the host (plan/budget.py) where the model on CUDA is a target, or a draft in full weights or 4
bits, whose head is not tied to it. A draft's captured step cannot look rows up on the host inside
its graph: the step looks them up before the replay and copies them into its buffers
(decoding/static_step.py).
"""

import torch
from torch import nn
from transformers import PreTrainedModel

from specchat.host_pull import HostSender


class HostEmbedding(nn.Module):
    """Looks token ids up in an embedding held on the host (`table`, not registered: moving the
    model to the device leaves it there) and returns the rows on the ids' device."""

    def __init__(self, embedding: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        object.__setattr__(self, "table", embedding.to("cpu"))
        # a parameter of no elements on the device: transformers takes a model's device from its first parameter
        self.anchor = nn.Parameter(torch.empty(0, device=device, dtype=dtype), requires_grad=False)
        self.sender: HostSender | None = None  # made for the device of the first ids looked up

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of `ids`, looked up on the host, on the ids' device: beside a GPU pulled by its
        threads, so that they wait for no layer the streamer is copying (host_pull.py)."""
        rows = self.table(ids.to("cpu"))
        if self.sender is None or self.sender.device != ids.device:
            self.sender = HostSender(ids.device)
        return self.sender.send(rows)


def keep_embedding_on_host(model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> None:
    """Move `model`'s input embedding to the host, looked up there for inputs on `device`."""
    model.set_input_embeddings(HostEmbedding(model.get_input_embeddings(), device, dtype))


def host_lookup(model: PreTrainedModel) -> nn.Module | None:
    """The host table that looks up `model`'s input rows, where its input embedding is held on the host."""
    embedding = model.get_input_embeddings()
    return embedding.table if isinstance(embedding, HostEmbedding) else None
