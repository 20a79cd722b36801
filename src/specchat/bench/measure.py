"""Measuring one prompt under one configuration: a specchat engine, or transformers' assisted
generation for comparison."""

from collections.abc import Callable
from dataclasses import asdict, fields
from time import perf_counter

import torch
from transformers import PreTrainedModel

from specchat.bench.runner import Measure, Point, Setup
from specchat.decoding.events import Engine, IterationEvent, LiveSettings, SamplingParams
from specchat.device_clock import now
from specchat.dtypes import DTYPES
from specchat.models.loading import load
from specchat.runtime import Models
from specchat.summary import Summary, summarize, tree_means


# Every row has these figures; null where a method does not expose them.
FIGURES = (*(field.name for field in fields(Summary)), "trees", "mean_tree_size", "mean_depth")


def run_prompts(engine: Engine, prompts: list[list[int]], max_new_tokens: int,
                sampling: SamplingParams) -> tuple[list[IterationEvent], float]:
    """Every prompt through `engine`: all their events, and the wall time spent generating (the
    host clock is right on CUDA too: an event carries its tokens on the host, so the last one is
    yielded once the device work behind it has finished)."""
    events, wall = [], 0.0
    for prompt_ids in prompts:
        start = perf_counter()
        events.extend(engine.generate(prompt_ids, max_new_tokens, sampling))
        wall += perf_counter() - start
    return events, wall


def measure_engine(engine: Engine, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> dict:
    events, wall = run_prompts(engine, [prompt_ids], max_new_tokens, sampling)
    summary, means = summarize(events, wall), tree_means(events)
    return {**asdict(summary), "trees": means.trees, "mean_tree_size": means.tree_size, "mean_depth": means.depth}


def plain_draft(spec: str, dtype: str, device: torch.device) -> PreTrainedModel:
    """The draft as its checkpoint holds it, for transformers' assisted generation: the int8
    linears and the sub-vocabulary head are specchat's levers, not the peer's, and its Python
    int8 modules would slow the peer down."""
    return load(spec, DTYPES[dtype], progress=False).model.to(device)


def measure_hf_assisted(target: PreTrainedModel, draft: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int,
                        sampling: SamplingParams, stop_ids: frozenset[int], pad_id: int | None) -> dict:
    """transformers' `generate(assistant_model=draft)`: only its tokens and wall time can be seen
    from outside, so the per-iteration figures (gen rate, draft / target time, tree) are null."""
    greedy = sampling.temperature == 0
    # The distribution specchat's engines sample: temperature and top-p only, where transformers
    # would add its global top_k=50 and the model's own defaults (e.g. a repetition penalty).
    options = {} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
    torch.manual_seed(sampling.seed)  # HF samples from torch's global generator
    start = now(target.device)
    out = target.generate(
        torch.tensor([prompt_ids], device=target.device), assistant_model=draft, max_new_tokens=max_new_tokens,
        do_sample=not greedy, repetition_penalty=1.0, eos_token_id=sorted(stop_ids), pad_token_id=pad_id, **options,
    )
    wall_s = now(target.device) - start
    new_tokens = out.shape[1] - len(prompt_ids)
    return {**dict.fromkeys(FIGURES), "new_tokens": new_tokens, "tokens_per_s": new_tokens / wall_s, "wall_s": wall_s}


def live_settings(point: Point, max_depth: int) -> LiveSettings:
    """A sweep's budget is the tree size of tree engines and the lookahead of dsi (its drafts per
    job); an engine ignores the settings it does not read."""
    return LiveSettings(budget=point.budget, depth=max_depth, lookahead=point.budget)


def engine_measurer(models: Models, setup: Setup) -> Callable[[Point], Measure]:
    """For each configuration, a measure that runs a new engine over `models`."""
    def measurer(point: Point) -> Measure:
        engine = models.engine(point.engine, live_settings(point, setup.max_depth))
        sampling = SamplingParams(point.temperature, setup.top_p, setup.seed)
        return lambda prompt_ids: measure_engine(engine, prompt_ids, setup.max_new_tokens, sampling)
    return measurer
