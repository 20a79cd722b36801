"""The measures of a sweep over models loaded once (`specchat.runtime.Models`): specchat's
engines, and transformers' assisted generation over the same target and draft."""

from collections.abc import Callable
from functools import cache

from specchat.bench.measure import engine_measurer, measure_hf_assisted, plain_draft
from specchat.bench.runner import HF_ASSISTED, Measure, Point, Setup
from specchat.decoding.events import SamplingParams
from specchat.engine_options import EngineOptions
from specchat.runtime import Models


def engine_options(setup: Setup) -> EngineOptions:
    return EngineOptions(target=setup.target, draft=setup.draft, max_depth=setup.max_depth, dtype=setup.dtype,
                         weights=setup.weights, context=setup.context, offload=setup.offload, workers=setup.workers)


def model_measurer(models: Models, setup: Setup) -> Callable[[Point], Measure]:
    """Measures over the loaded models: specchat's engines, and transformers' assisted generation."""
    engines = engine_measurer(models, setup)
    peer_draft = cache(lambda: plain_draft(setup.draft, setup.dtype, models.device))  # loaded once, if asked

    def measurer(point: Point) -> Measure:
        if point.engine != HF_ASSISTED:
            return engines(point)
        sampling = SamplingParams(point.temperature, setup.top_p, setup.seed)
        return lambda prompt_ids: measure_hf_assisted(
            models.target.model, peer_draft(), prompt_ids, setup.max_new_tokens, sampling, models.stop_ids,
            models.tokenizer.pad_token_id,
        )
    return measurer
