"""The models of a benchmark, loaded once and shared by every engine of the sweep."""

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from specchat.bench.measure import engine_measurer, measure_hf_assisted
from specchat.bench.runner import HF_ASSISTED, Measure, Point, Setup
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.stopping import stop_token_ids
from specchat.dsi.workers import WorkerPool, parse_devices, thread_workers
from specchat.models.compat import check_tokenizers_compatible
from specchat.models.loading import load
from specchat.offload.runner import Offload
from specchat.progress import Reporter
from specchat.runtime import DTYPES, EngineOptions, load_target, make_engine, pick_device


@dataclass
class BenchModels:
    target: CausalLM
    draft: CausalLM | None  # None when no engine of the sweep drafts
    tokenizer: PreTrainedTokenizerBase
    stop_ids: frozenset[int]
    offload: Offload | None
    workers: WorkerPool | None  # dsi's target workers, when the sweep runs dsi

    def close(self) -> None:
        """Stop the weight streamer of an offloaded target and dsi's workers."""
        if self.offload is not None:
            self.offload.close()
        if self.workers is not None:
            self.workers.close()


def engine_options(setup: Setup) -> EngineOptions:
    return EngineOptions(target=setup.target, draft=setup.draft, max_depth=setup.max_depth, dtype=setup.dtype,
                         offload=setup.offload)


def load_models(setup: Setup, with_draft: bool, with_workers: bool = False, progress: bool = True) -> BenchModels:
    device, dtype = pick_device(), DTYPES[setup.dtype]
    target, offload = load_target(engine_options(setup), device, dtype, Reporter(progress))
    draft = None
    if with_draft:
        loaded = load(setup.draft, dtype, progress, device=device)
        check_tokenizers_compatible(loaded.tokenizer, target.tokenizer)
        loaded.model.to(device)
        draft = CausalLM(loaded.model)
    stops = stop_token_ids(target.model, target.tokenizer)
    target_lm = CausalLM(target.model, offload)
    workers = WorkerPool(thread_workers(target_lm, parse_devices(setup.workers))) if with_workers else None
    return BenchModels(target_lm, draft, target.tokenizer, stops, offload, workers)


def model_measurer(models: BenchModels, setup: Setup) -> Callable[[Point], Measure]:
    """Measures over the loaded models: specchat's engines, and transformers' assisted generation."""
    engines = engine_measurer(
        lambda name, shape: make_engine(name, models.target, models.draft, models.stop_ids, shape, models.workers),
        setup,
    )

    def measurer(point: Point) -> Measure:
        if point.engine != HF_ASSISTED:
            return engines(point)
        sampling = SamplingParams(point.temperature, setup.top_p, setup.seed)
        return lambda prompt_ids: measure_hf_assisted(
            models.target.model, models.draft.model, prompt_ids, setup.max_new_tokens, sampling, models.stop_ids,
            models.tokenizer.pad_token_id,
        )
    return measurer
