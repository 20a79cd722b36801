"""The startup probe of `--budget auto`: how long a target pass over n tree tokens and a draft
step over b nodes take on this device, for `autosize.Costs`.

Each size is timed after a short context (what a chat's first turns look like) and the fastest
of a few runs is kept (the cost of the work, not of the noise around it). A model in memory passes
over the context once: before each timed pass its cache is cut back to the context, which holds
what a fresh pass would write (on a CPU without bf16 instructions, where a 64-token pass of the
1.5B costs ~4 s, the default pair's probe took 77-79 s with a pass before each timed one, 16-23 s
so). A streamed model passes over it before every timed pass, which leaves its ring and expert
cache as the previous pass of a reply does. Sizes grow
by doubling up to the cap, and stop early once a pass costs `STOP_RATIO` times the one-token
pass: no tree that large can pay, and the end segment extrapolates the rest.

On CUDA every timed region ends with a synchronize of the model's device (`device_clock.now`),
and the transfer counters are read after it: without it the clock would measure kernel launches,
and `--budget auto` would size trees as if a wide pass cost what a narrow one does. A draft whose
steps are captured as CUDA graphs (decoding/static_step.py) runs each size untimed first, once
eagerly and once captured, so that the timed runs replay as a reply's steps do: timed from the
first use, a size cost an eager step, a launch-bound multiple of a replay.

An offloaded target's pass is timed as compute: the time it waited for streamed layers is left
out, and the link's own cost, the seconds it takes to move a pass at the speed it showed during
the probe, is measured beside it (`Costs.iteration` puts the two together). For a MoE target
streamed by expert that is the layers' heads; the experts a pass fetches once its routers have
picked them cost it the time its compute waited for them, measured per size: what a tree of that
size costs on top (scattered reads the compute waits for, not bytes at the link's mean speed).
From the probed width whose calls routed so widely that the ring went on to load whole layers
(offload/experts.py), a pass costs the link the whole layers' bytes instead.
"""

import math
from collections.abc import Callable

import torch

from specchat.decoding.autosize import Costs
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import SlotCache, new_cache, truncate
from specchat.device_clock import now
from specchat.transfer import TransferStats

Done = Callable[[float], None]  # told the share of the probe's sizes measured so far
CONTEXT = 64  # tokens already cached when a pass is timed
REPEATS = 2
STOP_RATIO = 12.0
MAX_CHILDREN = 16


def doubling(cap: int) -> list[int]:
    sizes, n = [], 1
    while n < cap:
        sizes.append(n)
        n *= 2
    return sizes + [cap]


class Context:
    """The CONTEXT tokens cached before a timed pass of one model."""

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.cache: SlotCache | None = None

    def ready(self) -> SlotCache:
        """A cache holding exactly the context: the last one cut back to it where the model is in
        memory, else a new one filled by a pass over the context."""
        if self.cache is not None and self.lm.stream is None:
            truncate(self.cache, CONTEXT)
            return self.cache
        self.cache = new_cache()
        self.lm.hidden(torch.arange(CONTEXT) % self.lm.model.config.vocab_size, torch.arange(CONTEXT), self.cache)
        return self.cache


def time_pass(lm: CausalLM, n: int, run_head: bool, context: Context | None = None) -> tuple[float, float, bool]:
    """Seconds of one forward over n tokens after CONTEXT cached ones (plus the head work a tree
    step or pass does), the fastest of REPEATS, less the time spent waiting for streamed layers;
    the seconds such a pass waited for the experts it fetched, the mean of the REPEATS; and
    whether its calls had the ring load whole layers after them. `context` carries the cached
    context from one call to the next."""
    best, fetched = float("inf"), 0.0
    context = context or Context(lm)
    for _ in range(lm.uses_before_replay()):  # a captured draft's eager run and capture: a reply's are replays
        run_once(lm, n, run_head, context.ready())
    for _ in range(REPEATS):
        cache = context.ready()
        start = now(lm.device)  # the context's pass has finished, its waits are counted
        before = lm.transfer_stats()
        whole = run_once(lm, n, run_head, cache)
        elapsed = now(lm.device) - start
        moved = lm.transfer_stats() - before
        best, fetched = min(best, elapsed - moved.stall_s), fetched + moved.fetch_wait_s
    return best, fetched / REPEATS, whole


def run_once(lm: CausalLM, n: int, run_head: bool, cache: SlotCache) -> bool:
    """One forward over n tokens on `cache` and its head work; whether its calls had the ring
    load whole layers after them."""
    hidden = lm.hidden(torch.arange(n) % lm.model.config.vocab_size, torch.arange(CONTEXT, CONTEXT + n), cache)
    whole = lm.stream is not None and lm.stream.loading_whole
    if run_head:
        lm.top_logprobs(hidden, MAX_CHILDREN, 1.0)
    else:
        lm.logits(hidden[: min(n, lm.head_rows)])  # the walk's first call of the head
    return whole


def measure(lm: CausalLM, cap: int, run_head: bool, done: Callable[[int], None] = lambda sizes: None
            ) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...], float]:
    """Sizes, their seconds and their passes' waits for fetched experts; and the smallest size from
    which every pass had the ring load whole layers after it (inf: none). `done` is told how many
    sizes are measured after each."""
    sizes, seconds, fetched, wholes, context = [], [], [], [], Context(lm)
    for n in doubling(cap):
        sizes.append(n)
        cost, waited, whole = time_pass(lm, n, run_head, context)
        seconds.append(cost)
        fetched.append(waited)
        wholes.append(whole)
        done(len(sizes))
        if seconds[-1] > STOP_RATIO * seconds[0]:
            break
    narrow = [n for n, whole in zip(sizes, wholes) if not whole]
    wide_from = next((n for n in sizes if not narrow or n > narrow[-1]), math.inf)
    return tuple(sizes), tuple(seconds), tuple(fetched), wide_from


def link_seconds(nbytes: float, moved: TransferStats) -> float:
    """Seconds the link takes to move `nbytes` at the speed of the loads in `moved`; 0 when
    nothing moved."""
    return nbytes * moved.transfer_s / moved.bytes if moved.bytes else 0.0


def probe_costs(target: CausalLM, draft: CausalLM, cap: int, done: Done = lambda share: None) -> Costs:
    """Target passes over 1 .. cap + 1 tokens and draft steps over 1 .. cap nodes, and for an
    offloaded target the link's seconds per pass and the share of a pass it stages. `done` hears
    the share of the sizes measured after each (a startup's loading screen moves with it: the
    probe is its longest step)."""
    target_sizes, draft_sizes = len(doubling(cap + 1)), len(doubling(cap))
    total = target_sizes + draft_sizes  # at most: either may stop early
    before = target.transfer_stats()
    target_n, target_s, fetched, wide_from = measure(target, cap + 1, run_head=False,
                                                     done=lambda sizes: done(sizes / total))
    moved = target.transfer_stats() - before
    stream = target.stream
    stream_s = link_seconds(stream.pass_bytes, moved) if stream is not None else 0.0
    fetch_s = fetched if stream is not None and moved.fetched_bytes else ()
    draft_b, draft_s, _, _ = measure(draft, cap, run_head=True, done=lambda sizes: done((target_sizes + sizes) / total))
    staged = stream.staged_share if stream is not None else 1.0
    wide_s = link_seconds(stream.whole_pass_bytes, moved) if wide_from < math.inf else 0.0  # inf without a stream
    return Costs(target_n, target_s, draft_b, draft_s, stream_s, staged, fetch_s, wide_from, wide_s)
