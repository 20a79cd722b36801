"""The draft's step at fixed shapes, so that CUDA can capture it once per width and span and
replay it.

An eager draft step is a few dozen small kernels a layer: on a GPU a 7B draft's step is bound by
their launches (18-64 ms at 1-1024 nodes on an H200, design.md section 17), and a tree takes up
to 24 steps. With fixed shapes the whole step is captured in a CUDA graph and replayed as one
launch:
- the new rows are padded to a width bucket (a power of two); a pad row attends only to its own
  slot and writes its keys and values past the real rows, where no real row looks and the next
  step writes over them;
- the cache's buffers are reserved up front (`capacity` slots) and every layer returns the first
  `span` of them (kvcache.SlotCache.write_slots, .span), a span being a power of two from
  `least_span` (or the capacity) that holds the cache and the step's rows: a row attends over the
  span, masked to what the eager step lets it see (the committed prefix, its ancestors, itself).
  A graph is captured per (width, span): attending over the whole capacity instead (~6400 slots
  at the defaults) would read its keys and values, and compute its scores, in every layer of every
  step however short the conversation: for Llama-2-7B (32 KV heads of 128) at 256 rows that is
  256 x 6400 x 128 x 4 flops x 32 heads x 32 layers = 860 GFLOP and 3.4 GB of keys and values a
  step (~0.9 ms at an H200's 989 TFLOP/s peak), where a 300-token prompt and a 1024-node tree
  need a span of 2048;
- the tokens, positions, mask and slots are written into a (width, span)'s static buffers before
  each replay (the tokens and positions staged on the host, pinned beside a GPU, and pulled over
  by the GPU's threads, which wait neither for the device nor behind the streamer's layer copies:
  host_pull.py; the mask written in place from the step's: on a
  GPU each kernel launched and each synchronizing copy between two steps is time the device
  waits), and the cache's length is advanced by the real rows only; a draft whose input
  embedding is held on the host (offload/host_embedding.py) has its rows looked up there first,
  into a pinned staging of the step's input, and pulled over with the ids, since a graph cannot
  look them up on the host (a pageable copy would wait for the device: the H200's trace of
  2026-12-04 saw the lookup and that copy idle the device 0.3-3.5 ms a step).
A masked slot's weight underflows to exactly 0 in the softmax, so the real rows get what the
eager step gives them, up to the order of summation. Without `capture` the same code runs
eagerly (how a CPU tests it); SpecExec's verifier never reads the draft's probabilities, so a
difference there could only change the tree, never the emitted tokens.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from specchat.cuda_graph import Pool, capture_graph, repeating_shapes
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import SlotCache, cache_length
from specchat.host_pull import ReadFence, pull

Shape = tuple[int, int]  # a static step's (width bucket, span): one set of buffers and one graph each

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # widths a step is padded to; a wider one runs eagerly
LEAST_SPAN = 512  # the fewest slots a static step attends over: below it the attention costs nothing to speak of


def draft_slots(context: int, budget: int, pads: int = BUCKETS[-1]) -> int:
    """The slots a draft's cache may hold: the context, a tree of `budget` nodes with its root and,
    stepping at static shapes, a widest bucket's `pads` (an eager draft's rows have none); the
    memory plan counts the first two. Growing a tree may run more rows
    than it keeps: every node a step expands holds a slot until the tree is pruned, those its
    growth later drops too (the embedded 0.5B draft ran 1.15-3.5 rows a kept node, MT-Bench first
    turns at budgets 256-2048, greedy and t=0.6, 2026-11-30; a ranked tree, gpu_check --pair, ~5.5).
    Growth ends where the reserved slots do (StaticDraft.room) rather than grow the buffers, which
    would drop every captured graph: a short conversation leaves the tree the context's unused
    slots, one near the context's end cuts its late expansions (CausalLM.room, on a CPU too)."""
    return context + budget + 1 + pads


@dataclass
class StaticInputs:
    """One bucket's buffers, read by its captured step."""

    ids: torch.Tensor  # [2, B] the rows' tokens, then their positions
    staged: torch.Tensor  # [2, B] on the host, pinned beside a GPU: the next `ids`, pulled over at once
    mask: torch.Tensor  # [1, 1, B, span] additive
    slots: torch.Tensor  # [B] the cache slots the rows write
    embeds: torch.Tensor | None = None  # [1, B, H] the rows' input embeddings, where looked up on the host
    staged_embeds: torch.Tensor | None = None  # [B, H] on the host, pinned beside a GPU: the next `embeds`

    @property
    def tokens(self) -> torch.Tensor:
        return self.ids[0:1]

    @property
    def positions(self) -> torch.Tensor:
        return self.ids[1:2]


@dataclass
class StaticDraft(CausalLM):
    """A draft whose steps over up to 256 rows run at a bucket's fixed shapes (captured as CUDA
    graphs when `capture`); the first pass of a cache, wider steps and steps past the capacity run
    eagerly."""

    capacity: int = 0  # slots the cache reserves: the context, the largest tree and a bucket of pads
    capture: bool = False
    least_span: int = LEAST_SPAN
    lookup: nn.Embedding | None = None  # the input embedding, where it is held on the host
    inputs: dict[Shape, StaticInputs] = field(default_factory=dict)
    graphs: dict[Shape, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(default_factory=dict)
    used: set[Shape] = field(default_factory=set)  # shapes run once, uncaptured, on the current buffers
    # one memory pool for every graph's temporaries: they replay one at a time, each writing its
    # temporaries before reading them, and what a step returns is copied out before the next
    pool: Pool | None = None
    buffers: tuple[int, int, int] = (0, 0, 0)  # the cache, its first key buffer and its capacity they were made for
    captured: int = 0  # graphs captured so far, those since dropped included
    pulled: ReadFence = field(default_factory=ReadFence)  # a bucket's stagings are written again after it

    @torch.inference_mode()
    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, cache: SlotCache,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """CausalLM.hidden's rows, computed at the bucket's shapes."""
        n, length = tokens.numel(), cache_length(cache)
        bucket = bucket_for(n)
        if bucket is None or length == 0 or length + bucket > self.capacity:
            return super().hidden(tokens, positions, cache, mask)
        cache.reserve(self.capacity)
        self.follow(cache)
        shape = (bucket, span_for(length + bucket, self.least_span, self.capacity))
        inputs = self.inputs.get(shape) or self.allocate(shape)
        self.fill(inputs, tokens, positions, mask, length)
        cache.write_slots, cache.span = inputs.slots, shape[1]
        try:
            hidden = self.replay(shape, inputs, cache) if self.capture else self.step(inputs, cache)
        finally:
            cache.write_slots, cache.span = None, 0
        cache.advance(n)
        return hidden[:n].clone()  # the static output is written over by the next replay

    def fill(self, inputs: StaticInputs, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
             length: int) -> None:
        """Write a step's rows, zero pads after them, into the bucket's buffers: the ids (and the
        rows' embeddings, where looked up on the host) staged on the host and pulled over, which on
        a GPU waits neither for the device nor behind the layers its copy engine moves (host_pull.py;
        a staging is written again only once the pulls from it are done), the mask and slots in
        place."""
        n, staged = tokens.numel(), inputs.staged
        self.pulled.wait()
        staged.zero_()
        staged[0, :n] = tokens
        staged[1, :n] = positions
        pull(inputs.ids, staged)
        if inputs.embeds is not None:
            stage_rows(inputs.staged_embeds, self.lookup.weight, tokens.cpu())
            pull(inputs.embeds[0], inputs.staged_embeds)
        self.pulled.pass_(inputs.ids.device)
        write_mask(inputs.mask[0, 0], mask, n, length)
        torch.arange(length, length + inputs.slots.numel(), out=inputs.slots)

    def graphs_captured(self) -> int:
        return self.captured

    def uses_before_replay(self) -> int:
        return 2 if self.capture else 0  # eager, then captured (`replay`)

    def room(self, cache: SlotCache) -> int:
        """The most rows a step may run at `cache`'s length within the reserved slots, its pads
        included: the free slots past the widest bucket (a wider step runs eagerly), else the
        widest bucket they hold."""
        free = self.capacity - cache_length(cache)
        if free >= BUCKETS[-1]:
            return free
        return max((width for width in BUCKETS if width <= free), default=0)

    def follow(self, cache: SlotCache) -> None:
        """Drop the buffers and graphs made for another cache (a new conversation's) or for
        buffers since reallocated (a wider eager step grew them)."""
        buffers = (id(cache), cache.layers[0].key_slots.data_ptr(), cache.capacity())
        if buffers != self.buffers:
            self.inputs.clear()
            self.graphs.clear()
            self.used.clear()
            self.pool = None
            self.buffers = buffers

    def allocate(self, shape: Shape) -> StaticInputs:
        device, (bucket, span), pinned = self.device, shape, self.device.type == "cuda"
        inputs = StaticInputs(
            ids=torch.zeros(2, bucket, dtype=torch.long, device=device),
            staged=torch.zeros(2, bucket, dtype=torch.long, pin_memory=pinned),
            mask=torch.zeros(1, 1, bucket, span, dtype=self.dtype, device=device),
            slots=torch.zeros(bucket, dtype=torch.long, device=device))
        if self.lookup is not None:
            rows = (bucket, self.model.config.hidden_size)
            inputs.embeds = torch.zeros(1, *rows, dtype=self.dtype, device=device)
            inputs.staged_embeds = torch.zeros(rows, dtype=self.lookup.weight.dtype, pin_memory=pinned)
        self.inputs[shape] = inputs
        return inputs

    def step(self, inputs: StaticInputs, cache: SlotCache) -> torch.Tensor:
        """The bucket's step at its fixed shapes, which every step of the bucket repeats."""
        rows = {"input_ids": inputs.tokens} if inputs.embeds is None else {"inputs_embeds": inputs.embeds}
        with repeating_shapes():
            out = self.model.get_decoder()(**rows, position_ids=inputs.positions, attention_mask=inputs.mask,
                                           cache=cache, use_cache=True)
        return out.last_hidden_state[0]

    def replay(self, shape: Shape, inputs: StaticInputs, cache: SlotCache) -> torch.Tensor:
        """The shape's graph, captured at its second use on the cache's buffers (the --budget auto
        probe uses each size twice untimed first: decoding/probe.py times replays, as a reply runs)."""
        if shape not in self.graphs:
            if shape not in self.used:
                self.used.add(shape)
                return self.step(inputs, cache)
            self.pool = self.pool or torch.cuda.graph_pool_handle()
            self.graphs[shape] = capture_graph(lambda: self.step(inputs, cache), self.pool)
            self.captured += 1
        graph, output = self.graphs[shape]
        graph.replay()
        return output


def bucket_for(rows: int) -> int | None:
    """The width a step of `rows` rows is padded to; None past the widest bucket (run eagerly)."""
    return next((width for width in BUCKETS if width >= rows), None)


def span_for(slots: int, least: int, capacity: int) -> int:
    """The slots a step attends over when its rows end at `slots`: the power of two from `least`
    that holds them, or the whole capacity where that is fewer; powers of two keep the graphs to a
    few per width at the price of at most twice the slots needed."""
    span = least
    while span < slots:
        span *= 2
    return min(span, capacity)


def stage_rows(staging: torch.Tensor, table: torch.Tensor, tokens: torch.Tensor) -> None:
    """Write the rows of `table` [V, H] (on the host) that `tokens` [n] name into `staging`
    [B, H], zeros after them: a pad row's input, which attends to itself alone and whose output
    nothing reads."""
    n = tokens.numel()
    torch.index_select(table, 0, tokens, out=staging[:n])
    staging[n:].zero_()


def write_mask(additive: torch.Tensor, mask: torch.Tensor | None, n: int, length: int) -> None:
    """Write a bucket's additive mask [bucket, span] in place: the real rows see what `mask`
    [n, length + n] (bool, on the device) lets them (None: every cached slot and the new rows
    causally), a pad row only its own slot; everything else is the dtype's min."""
    additive.fill_(torch.finfo(additive.dtype).min)
    seen = additive[:n, : length + n]
    if mask is None:
        seen[:, :length] = 0
        seen[:, length:].masked_fill_(torch.ones(n, n, dtype=torch.bool, device=additive.device).tril(), 0)
    else:
        seen.masked_fill_(mask.to(additive.device), 0)
    additive[n:, length + n: length + additive.shape[0]].fill_diagonal_(0)  # pad row n + i: slot length + n + i


def static_draft(draft: CausalLM, capacity: int, capture: bool, lookup: nn.Embedding | None = None) -> StaticDraft:
    """`draft` (its model, sub-vocabulary head and all) stepping at fixed shapes; `lookup`: its
    input embedding, where that is held on the host."""
    return StaticDraft(model=draft.model, stream=draft.stream, vocab=draft.vocab, head=draft.head,
                       capacity=capacity, capture=capture, lookup=lookup)
