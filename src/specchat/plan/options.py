"""From a run's options to what the plan is asked: the one place where `run` (loader.py) and
`doctor` turn --weights, --draft-quant, --draft-vocab, --offload, --offload-dir,
--resident-layers, --ram-budget, --vram-budget, --budget and --context into a `Pair` and a
`PlanRequest`, so that both ask the same of the same machine."""

from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

from specchat.dtypes import DTYPES
from specchat.machine_links import Links, read_links
from specchat.models.draft import DraftQuant, resolve_draft_quant
from specchat.models.loading import has_int4
from specchat.models.spec import resolve
from specchat.paths import expanded, offload_dir as default_offload_dir
from specchat.plan.machine import Machine
from specchat.plan.pair import draft_kinds
from specchat.plan.request import Pair, PlanRequest, tree_sizes
from specchat.transfer import gb_to_bytes


class RunOptions(Protocol):
    """The options the plan reads, named as on the command line (runtime.EngineOptions carries
    them; the plan sits below the runtime)."""

    target: str
    draft: str
    dtype: str  # one of limits.DTYPE_NAMES
    weights: str  # auto | quantized | dense
    offload: str  # auto | none | ram | disk
    offload_dir: str | None
    resident_layers: int | None
    ram_budget: float | None  # GB, as --ram-budget takes it
    vram_budget: float | None  # GB, as --vram-budget takes it
    context: int | None
    draft_quant: str
    draft_vocab: int
    budget: int | str | None


Options = TypeVar("Options", bound=RunOptions)


def request_for(options: RunOptions, machine: Machine, drafted: bool,
                conversations: int | None) -> tuple[Pair, PlanRequest]:
    """What `run` with `options` asks of `machine` (`drafted`: with its draft; `conversations`: the
    KV caches kept at once, serve's --slots, None for auto): the pair and the request `plan_pair`
    takes (or `measure_pair`, to plan it under many rooms)."""
    options = resolve_weights(options)
    device = machine.device()
    cuda = device.type == "cuda"
    dtype = DTYPES[options.dtype]
    draft = {}
    if drafted:
        quant = draft_quant_for(options, machine)
        draft = {"draft": options.draft, "dense_above": quant.dense_above, "draft_vocab": options.draft_vocab or None,
                 "draft_kinds": draft_kinds(options.draft_quant, device, quant.kind, described=machine.described),
                 "measure_steps": not machine.described and machine.rooms is None}
    pair = Pair(options.target, dtype, options.weights, context=options.context, **draft)
    tree_tokens, smaller_trees = tree_sizes(cuda, options.budget if isinstance(options.budget, int) else 0)
    # A CPU's 4-bit linears keep dense copies for tree passes where the room left holds them. Which
    # shapes gain is measured on this CPU (quant/int4_dense.py), so a described machine, whose CPU
    # is not this one, is planned without them: they are only ever added to room left over, so the
    # plan's placement, context and draft are the same either way.
    dense_copies = quantized_weights(options) and not cuda and not machine.described
    request = PlanRequest(tier=options.offload, offload_dir=offload_directory(options),
                          resident_layers=options.resident_layers, ram_budget_bytes=gb_to_bytes(options.ram_budget),
                          vram_budget_bytes=gb_to_bytes(options.vram_budget), tree_tokens=tree_tokens,
                          smaller_trees=smaller_trees, dense_copies=dense_copies, links=links_of(machine),
                          conversations=conversations)
    return pair, request


def links_of(machine: Machine) -> Links:
    """The links' speeds the plan predicts a pass with: a described machine's as given, else this
    machine's as given (doctor's fresh measurement) or as doctor last measured them."""
    kept = Links() if machine.described else read_links()
    return Links(machine.pcie_gbps or kept.ram_gbps, machine.disk_gbps or kept.disk_gbps)


def draft_quant_for(options: RunOptions, machine: Machine) -> DraftQuant:
    """--draft-quant as `run` resolves it on `machine`: `auto` measured here, once per machine
    (models.draft.resolve_draft_quant: int8 on a CPU, up to the widths where it pays; full weights
    on a GPU). A described machine cannot be measured: there `auto` is full weights on a GPU (the
    plan weighs nf4 beside them) and int8 at every width on a CPU, its smallest form, which the
    plan falls back to wherever the dense copies of a measured crossover do not fit."""
    device = machine.device()
    if machine.described and options.draft_quant == "auto":
        return DraftQuant("none" if device.type == "cuda" else "int8")
    return resolve_draft_quant(options.draft_quant, device, DTYPES[options.dtype])


def resolve_weights(options: Options) -> Options:
    """`options` with --weights decided, once, before anything loads: `auto` runs the target from
    the 4-bit weights it stores ("quantized") whenever it has them, except in float32, which keeps
    the dense path that the exactness tests compare with transformers."""
    if options.weights != "auto":
        return options
    quantized = options.dtype != "float32" and has_int4(resolve(options.target))
    return replace(options, weights="quantized" if quantized else "dense")


def quantized_weights(options: RunOptions) -> bool:
    """Whether `options` (their --weights decided by `resolve_weights`) run the target's 4-bit weights."""
    if options.weights == "auto":
        raise ValueError("--weights auto is decided once by resolve_weights before it is read")
    return options.weights == "quantized"


def offload_directory(options: RunOptions) -> Path:
    """--offload-dir, or the default in the user's cache."""
    return expanded(options.offload_dir, "--offload-dir") if options.offload_dir else default_offload_dir()
