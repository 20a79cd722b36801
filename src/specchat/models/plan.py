"""The memory plan of a target and its draft, made from their configs before anything is
downloaded or loaded (`offload/budget.py` does the arithmetic): the contexts and the draft
quantizations `auto` may choose among, and where the target's sizes come from."""

import importlib.util
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from specchat.errors import SpecchatError
from specchat.limits import CONTEXT, DEFAULT_CONTEXT
from specchat.models.configs import config_from_file, read_config
from specchat.models.embedded import EMBEDDED, converted_path, int4_path
from specchat.models.loading import ModelSource, resolve, stored_name
from specchat.models.marker import is_converted, is_current_int4
from specchat.offload.budget import SMALLEST_CONTEXT, Draft, MemoryPlan
from specchat.offload.build import OffloadPlan, plan_model
from specchat.offload.demand import draft_weight_bytes, preparing_bytes, shape_of
from specchat.offload.placement import Rooms
from specchat.offload.skeleton import build_skeleton
from specchat.offload.sources import SafetensorsSource


def contexts_for(requested: int | None, model_max: int) -> tuple[int, ...]:
    """The KV room's lengths in order of preference: the one asked for, checked against the
    model's maximum; by default DEFAULT_CONTEXT (or the model's maximum when smaller), then halves
    down to SMALLEST_CONTEXT that auto may fall back to."""
    if requested is not None:
        CONTEXT.check("--context", requested)
        if requested > model_max:
            raise SpecchatError(f"--context {requested} is past the target's maximum of {model_max} tokens")
        return (requested,)
    first = min(DEFAULT_CONTEXT, model_max)
    contexts = [first]
    while contexts[-1] // 2 >= SMALLEST_CONTEXT:
        contexts.append(contexts[-1] // 2)
    return tuple(contexts)


def draft_kinds(kind: str, device: torch.device, resolved: str | None) -> tuple[str, ...]:
    """The quantizations the plan may give the draft: the one asked for (or, on a CPU, the one
    `auto` measured: `resolved`); on a GPU `auto` weighs full weights against nf4 (when
    bitsandbytes is installed)."""
    if kind != "auto" or device.type != "cuda":
        return (resolved or kind,)
    return ("none", "nf4") if importlib.util.find_spec("bitsandbytes") else ("none",)


def draft_candidates(spec: str, dtype: torch.dtype, kinds: tuple[str, ...], dense_above: int | None,
                     vocab_size: int | None, device: torch.device) -> tuple[Draft, ...]:
    """The draft `spec` in each of `kinds` on `device`, sized from its config, preferred first. An
    int8 draft that keeps dense copies for steps wider than `dense_above` rows (None: none) comes
    with its int8-only form after it, which the plan takes where the copies do not fit."""
    config = read_config(spec)
    model = build_skeleton(config, None, dtype, kernel=device)
    shape = shape_of(config, dtype)
    full = draft_weight_bytes(model, dtype, "none")

    def candidate(kind: str, above: int | None) -> Draft:
        weights = draft_weight_bytes(model, dtype, kind, above is not None, vocab_size)
        return Draft(kind, weights, shape, 0 if kind == "nf4" else full,
                     preparing_bytes(model, dtype) if kind == "int8" else 0, above)

    forms = [(kind, dense_above if kind == "int8" else None) for kind in kinds]
    forms += [("int8", None) for kind, above in forms if kind == "int8" and above is not None]
    return tuple(candidate(kind, above) for kind, above in forms)


def plan_target(spec: str, dtype: torch.dtype, device: torch.device, plan: OffloadPlan, context: int | None,
                rooms: Rooms | None = None, int4: bool = False) -> MemoryPlan:
    """Where `plan` puts `spec` (from its 4-bit weights when `int4`) and its draft on this machine
    (or in `rooms`) at `context` tokens (None: the default, which auto may shrink): a local
    safetensors checkpoint is measured as it is (and its layer file reused), anything else is
    sized from its config, before any download or conversion (dense: an embedded model's 4-bit
    form takes less)."""
    source = resolve(spec)
    local = local_safetensors(source, int4)
    config = config_from_file(local / "config.json") if local is not None else read_config(spec)
    tensors = SafetensorsSource(local) if local is not None else None
    plan = replace(plan, contexts=contexts_for(context, config.max_position_embeddings))
    return plan_model(config, tensors, stored_name(source, int4), dtype, device, plan, rooms)


def local_tokenizer(spec: str, int4: bool = False) -> PreTrainedTokenizerBase | None:
    """The tokenizer of `spec` when its safetensors directory is already here, loaded before the
    memory plan so that what the plan measures the process holding includes it (Qwen2.5's takes
    0.13 GB); None when the model is still to be fetched or converted (it loads with the weights)."""
    directory = local_safetensors(resolve(spec), int4)
    return None if directory is None else AutoTokenizer.from_pretrained(directory)


def local_safetensors(source: ModelSource, int4: bool = False) -> Path | None:
    """The directory of `source`'s safetensors (its 4-bit ones when `int4`) when they are already
    here, else None."""
    if source.kind == "dir" and any(Path(source.location).glob("*.safetensors")):
        return Path(source.location)
    if source.kind == "embedded":
        model = EMBEDDED[source.location]
        directory = int4_path(model) if int4 else converted_path(model)
        return directory if (is_current_int4 if int4 else is_converted)(directory) else None
    return None

