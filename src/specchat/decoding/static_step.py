"""The draft's step at fixed shapes, so that CUDA can capture it once per width and replay it.

An eager draft step is a few dozen small kernels a layer: on a GPU a 7B draft's step is bound by
their launches (18-64 ms at 1-1024 nodes on an H200, design.md section 17), and a tree takes up
to 24 steps. With fixed shapes the whole step is captured in a CUDA graph and replayed as one
launch:
- the new rows are padded to a width bucket (a power of two); a pad row attends only to its own
  slot and writes its keys and values past the real rows, where no real row looks and the next
  step writes over them;
- the cache's buffers are reserved up front (`capacity` slots) and every layer returns all of
  them (kvcache.SlotCache.write_slots): a row attends over the whole capacity, masked to what
  the eager step lets it see (the committed prefix, its ancestors, itself);
- the tokens, positions, mask and slots are copied into one bucket's static buffers before each
  replay, and the cache's length is advanced by the real rows only.
A masked slot's weight underflows to exactly 0 in the softmax, so the real rows get what the
eager step gives them, up to the order of summation. Without `capture` the same code runs
eagerly (how a CPU tests it); SpecExec's verifier never reads the draft's probabilities, so a
difference there could only change the tree, never the emitted tokens.
"""

from dataclasses import dataclass, field

import torch

from specchat.cuda_graph import capture_graph
from specchat.decoding.forward import CausalLM, to_additive_mask
from specchat.decoding.kvcache import SlotCache, cache_length

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # widths a step is padded to; a wider one runs eagerly


@dataclass
class StaticInputs:
    """One bucket's buffers, read by its captured step."""

    tokens: torch.Tensor  # [1, B]
    positions: torch.Tensor  # [1, B]
    mask: torch.Tensor  # [1, 1, B, capacity] additive
    slots: torch.Tensor  # [B] the cache slots the rows write


@dataclass
class StaticDraft(CausalLM):
    """A draft whose steps over up to 256 rows run at a bucket's fixed shapes (captured as CUDA
    graphs when `capture`); the first pass of a cache, wider steps and steps past the capacity run
    eagerly."""

    capacity: int = 0  # slots the cache reserves: the context, the largest tree and a bucket of pads
    capture: bool = False
    inputs: dict[int, StaticInputs] = field(default_factory=dict)
    graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)  # buckets run once, uncaptured, on the current buffers
    buffers: tuple[int, int, int] = (0, 0, 0)  # the cache, its first key buffer and its capacity they were made for

    @torch.inference_mode()
    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """CausalLM.hidden's rows, computed at the bucket's shapes."""
        n, length = tokens.numel(), cache_length(cache)
        bucket = next((width for width in BUCKETS if width >= n), None)
        if bucket is None or length == 0 or length + bucket > self.capacity:
            return super().hidden(tokens, positions, cache, mask)
        cache.reserve(self.capacity)
        self.follow(cache)
        inputs = self.inputs.get(bucket) or self.allocate(bucket, cache.capacity())
        fill(inputs, tokens, positions, attended(mask, n, length, bucket, cache.capacity()), length, self.dtype)
        cache.write_slots = inputs.slots
        try:
            hidden = self.replay(bucket, inputs, cache) if self.capture else self.step(inputs, cache)
        finally:
            cache.write_slots = None
        cache.advance(n)
        return hidden[:n].clone()  # the static output is written over by the next replay

    def follow(self, cache: SlotCache) -> None:
        """Drop the buffers and graphs made for another cache (a new conversation's) or for
        buffers since reallocated (a wider eager step grew them)."""
        buffers = (id(cache), cache.layers[0].key_slots.data_ptr(), cache.capacity())
        if buffers != self.buffers:
            self.inputs.clear()
            self.graphs.clear()
            self.used.clear()
            self.buffers = buffers

    def allocate(self, bucket: int, capacity: int) -> StaticInputs:
        device = self.device
        self.inputs[bucket] = StaticInputs(
            tokens=torch.zeros(1, bucket, dtype=torch.long, device=device),
            positions=torch.zeros(1, bucket, dtype=torch.long, device=device),
            mask=torch.zeros(1, 1, bucket, capacity, dtype=self.dtype, device=device),
            slots=torch.zeros(bucket, dtype=torch.long, device=device))
        return self.inputs[bucket]

    def step(self, inputs: StaticInputs, cache: SlotCache) -> torch.Tensor:
        out = self.model.get_decoder()(input_ids=inputs.tokens, position_ids=inputs.positions,
                                       attention_mask=inputs.mask, cache=cache, use_cache=True)
        return out.last_hidden_state[0]

    def replay(self, bucket: int, inputs: StaticInputs, cache: SlotCache) -> torch.Tensor:
        """The bucket's graph, captured at its second use on the cache's buffers: a cache used
        once (the --budget auto probe's, each size on a fresh one) never pays for a capture."""
        if bucket not in self.graphs:
            if bucket not in self.used:
                self.used.add(bucket)
                return self.step(inputs, cache)
            self.graphs[bucket] = capture_graph(lambda: self.step(inputs, cache))
        graph, output = self.graphs[bucket]
        graph.replay()
        return output


def attended(mask: torch.Tensor | None, n: int, length: int, bucket: int, capacity: int) -> torch.Tensor:
    """bool [bucket, capacity]: the real rows see what `mask` [n, length + n] lets them (None:
    every cached slot and the new rows causally), a pad row only its own slot."""
    attend = torch.zeros(bucket, capacity, dtype=torch.bool)
    if mask is None:
        attend[:n, :length] = True
        attend[:n, length:length + n] = torch.ones(n, n, dtype=torch.bool).tril()
    else:
        attend[:n, :length + n] = mask
    pads = torch.arange(n, bucket)
    attend[pads, length + pads] = True
    return attend


def fill(inputs: StaticInputs, tokens: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor, length: int,
         dtype: torch.dtype) -> None:
    """Copy a step's rows, zero pads after them, into the bucket's buffers."""
    n, bucket = tokens.numel(), inputs.slots.numel()
    device = inputs.tokens.device
    inputs.tokens.zero_()
    inputs.tokens[0, :n].copy_(tokens)
    inputs.positions.zero_()
    inputs.positions[0, :n].copy_(positions)
    inputs.mask.copy_(to_additive_mask(attend, dtype, device))
    inputs.slots.copy_(torch.arange(length, length + bucket, device=device))


def static_draft(draft: CausalLM, capacity: int, capture: bool) -> StaticDraft:
    """`draft` (its model, sub-vocabulary head and all) stepping at fixed shapes."""
    return StaticDraft(model=draft.model, stream=draft.stream, vocab=draft.vocab, head=draft.head,
                       capacity=capacity, capture=capture)
