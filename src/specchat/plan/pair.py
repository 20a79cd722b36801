"""The one entry to the memory plan: a target and its draft (`Pair`) with the run's offload
options (`PlanRequest`) on a machine (this one, or one described), made from their configs before
anything is downloaded or loaded. `loader` and `doctor` both call `plan_pair` (doctor's search for
the smallest memory limit `measure_pair` once, then `plan_measured` under each limit) with what
`options.request_for` makes of their options; the arithmetic is
`budget.py`'s, the model's sizes `model.py`'s. Here: the contexts and the draft forms auto may
choose among, and where the target's sizes come from."""

import importlib.util
from dataclasses import replace

import torch
from transformers import PretrainedConfig

from specchat.errors import SpecchatError
from specchat.limits import DEFAULT_CONTEXT
from specchat.models.configs import config_from_file, read_config
from specchat.models.loading import stored_name
from specchat.models.spec import resolve
from specchat.models.local import local_safetensors
from specchat.checkpoint.skeleton import build_skeleton, without_quantization
from specchat.checkpoint.sources import SafetensorsSource
from specchat.models.draft import DraftQuant
from specchat.models.draft_step import step_cost
from specchat.plan.budget import SMALLEST_CONTEXT, MemoryPlan
from specchat.plan.draft_form import Draft
from specchat.plan.choice import step_width
from specchat.plan.conversations import plan_conversations
from specchat.plan.demand import (draft_weight_bytes, expanding_bytes, preparing_bytes, rounded_workspace,
                                   rounding_bytes, shape_of)
from specchat.plan.machine import Machine
from specchat.plan.model import MeasuredModel, measure_model
from specchat.plan.request import DEFAULT_TREE_TOKENS, Pair, PlanRequest
from specchat.plan.sizes import host_embedding_bytes
from specchat.quant.awq import read_awq_spec
from specchat.quant.fp8 import fp8_runs_on
from specchat.quant.gptq import read_gptq_spec


def plan_pair(pair: Pair, request: PlanRequest, machine: Machine) -> MemoryPlan:
    """Where `request` puts `pair` on `machine`: a local safetensors checkpoint is measured as it
    is (and its layer file reused), anything else is sized from its config, before any download
    or conversion (dense: an embedded model's 4-bit form takes less). One-line PlanRefusal when
    nothing fits; SpecchatError for a --context past the target's maximum."""
    return plan_conversations(measure_pair(pair, request, machine.device()), machine)


def measure_pair(pair: Pair, request: PlanRequest, device: torch.device) -> MeasuredModel:
    """What `plan_pair` plans `pair` from on a machine with `device`, whatever its rooms: the
    target's skeleton and the draft's candidate forms (each with its step's cost on this machine
    where `pair.measure_steps` and there is a choice to make), with the contexts auto may choose among."""
    source = resolve(pair.target)
    local = local_safetensors(source, pair.weights)
    config = config_from_file(local / "config.json") if local is not None else read_config(pair.target)
    tensors = SafetensorsSource(local) if local is not None else None
    drafts = (None,) if pair.draft is None else draft_candidates(pair, device, request.tree_tokens)
    if pair.measure_steps and len(drafts) > 1:
        drafts = with_step_costs(drafts, pair.draft, pair.dtype, device, request.tree_tokens)
    request = replace(request, contexts=contexts_for(pair.context, config.max_position_embeddings), drafts=drafts)
    return measure_model(config, tensors, stored_name(source, pair.weights), pair.dtype, device, request)


def with_step_costs(drafts: tuple[Draft, ...], draft: str, dtype: torch.dtype, device: torch.device,
                    tree_tokens: int) -> tuple[Draft, ...]:
    """`drafts` with their step's cost on `device` (models/draft_step.py), measured at the width of
    a step of the largest tree: its nodes shared among the most steps a tree takes (choice.step_width)."""
    wide = step_width(tree_tokens)
    return tuple(replace(form, step=step_cost(draft, DraftQuant(form.quant, form.dense_above), dtype, device, wide))
                 for form in drafts)


def contexts_for(context: int | None, model_max: int) -> tuple[int, ...]:
    """The KV room's lengths in order of preference: the one asked for (its range checked with the
    other options, before anything loads: runtime.validate, doctor's check_numbers), checked
    against the model's maximum; by default DEFAULT_CONTEXT (or the model's maximum when smaller),
    then halves down to SMALLEST_CONTEXT that auto may fall back to."""
    if context is not None:
        if context > model_max:
            raise SpecchatError(f"--context {context} is past the target's maximum of {model_max} tokens")
        return (context,)
    first = min(DEFAULT_CONTEXT, model_max)
    contexts = [first]
    while contexts[-1] // 2 >= SMALLEST_CONTEXT:
        contexts.append(contexts[-1] // 2)
    return tuple(contexts)


def draft_kinds(kind: str, device: torch.device, resolved: str | None, described: bool) -> tuple[str, ...]:
    """The quantizations the plan may give the draft: the one asked for (or, on a CPU, the one
    `auto` measured: `resolved`); on a GPU `auto` weighs full weights against int4 and nf4 (nf4
    when bitsandbytes is installed here, or on any `described` machine), and fp8 on a GPU here
    that multiplies it (a described card's fp8 units are not known)."""
    if kind != "auto" or device.type != "cuda":
        return (resolved or kind,)
    kinds = ("none", "int4", "nf4") if described or has_bitsandbytes() else ("none", "int4")
    return kinds + ("fp8",) if not described and fp8_runs_on(device) else kinds


def has_bitsandbytes() -> bool:
    """Whether bitsandbytes, which nf4 runs on, is installed here."""
    return importlib.util.find_spec("bitsandbytes") is not None


def stores_4bit(config: PretrainedConfig) -> bool:
    """Whether a checkpoint of `config` holds GPTQ or AWQ packed 4-bit weights, which run packed."""
    settings = getattr(config, "quantization_config", None)
    if settings is None:
        return False
    stored = {"quantization_config": settings if isinstance(settings, dict) else settings.to_dict()}
    return read_gptq_spec(stored) is not None or read_awq_spec(stored) is not None


def stored_4bit_kinds(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The forms a draft stored in 4 bits (GPTQ, AWQ) may take for `kinds` asked: packed as stored
    (none, its smallest), expanded (dense) or expanded into fp8, and each of them where auto weighs
    several (on a GPU; fp8 where the GPU multiplies it)."""
    if len(kinds) == 1:
        return ("none",) if kinds[0] in ("none", "int4", "nf4", "int8") else kinds
    return ("none", "dense", "fp8") if "fp8" in kinds else ("none", "dense")


def draft_candidates(pair: Pair, device: torch.device, tree_tokens: int = DEFAULT_TREE_TOKENS) -> tuple[Draft, ...]:
    """`pair`'s draft in each of its kinds on `device`, sized from its config, preferred first. An
    int8 draft that keeps dense copies for steps wider than `pair.dense_above` rows comes with its
    int8-only form after it, which the plan takes where the copies do not fit. An int4 draft
    counts its 4-bit products' largest temporary over a step of `tree_tokens` rows."""
    config = read_config(pair.draft)
    stored = stores_4bit(config)
    kinds = stored_4bit_kinds(pair.draft_kinds) if stored else pair.draft_kinds
    dtype = pair.dtype
    model = build_skeleton(config, None, dtype, kernel=device)
    dense = build_skeleton(without_quantization(config), None, dtype, kernel=device)  # a 4-bit draft expanded
    shape = shape_of(config, dtype)
    full = draft_weight_bytes(model, dtype, "none")

    # beside a GPU an untied input embedding is read a row a token: held on the host, its bytes go to
    # resident target layers (not under nf4, which transformers loads straight onto the device)
    host = host_embedding_bytes(model, dtype) if device.type == "cuda" else 0

    def candidate(kind: str, above: int | None) -> Draft:
        on_host = host if kind in ("none", "int4", "dense", "fp8") else 0
        if kind == "dense" or kind == "fp8" and stored:  # loaded a layer at a time onto the device, expanded there
            weights = draft_weight_bytes(dense, dtype, "none" if kind == "dense" else kind, head_rows=pair.draft_vocab,
                                         kernel=device)
            return Draft(kind, weights - on_host, shape, 0, expanding_bytes(dense, dtype), None, host_embedding=on_host)
        weights = draft_weight_bytes(model, dtype, kind, above is not None, pair.draft_vocab, kernel=device)
        preparing = (preparing_bytes(model, dtype) if kind == "int8" else
                     rounding_bytes(model, dtype) if kind in ("int4", "fp8") else 0)
        workspace = rounded_workspace(model, dtype, tree_tokens, device) if kind == "int4" else 0
        # nf4 loads straight onto the device; int4 and fp8 one layer at a time, each converted there
        # (models/layerwise.py)
        through_ram = 0 if kind in ("nf4", "int4", "fp8") else full
        return Draft(kind, weights - on_host, shape, through_ram, preparing, above, workspace=workspace,
                     host_embedding=on_host)

    forms = [(kind, pair.dense_above if kind == "int8" else None) for kind in kinds]
    forms += [("int8", None) for kind, above in forms if kind == "int8" and above is not None]
    return tuple(candidate(kind, above) for kind, above in forms)
