"""`--scale --parts profile`: where a Llama-2-7B-shaped draft's step spends its device time, kernel
by kernel. The draft is prepared as the loader prepares one on the device (models/draft_approx.py),
and a step of n tree tokens runs at its bucket's static shapes eagerly, under torch.profiler, so
that each kernel has a record of its own (a captured step replays the same kernels, without their
launches). Per width, the kernels with the most device time a step, their calls a step, and the
step's device time in all beside its wall time: their difference is what launching costs, which a
captured step saves; the device time is what it cannot. On a CPU (the dry run) its ops' CPU time.

Then one Llama-2-70B-shaped target layer (bf16, random weights: its attention bounded as every
model's is, bounded_attention.py; its int4 products' workspace the plan counts apart) over a
2048-token tree after 4096 cached tokens: the memory its pass allocates above what it started with,
as SDPA chooses its kernels and with its math path alone (where no fused kernel serves, in bounded
calls), beside what the plan reserves for a pass (plan/demand.ModelShape.pass_bytes: its attention
packed as rows of 8 KV heads, a bounded call's math-path scores, float32 keys and values and
repeated mask, 0.34 GB of its 0.89), and the kernels it ran, which name the attention SDPA chose."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from time import perf_counter

import torch
from gpu_checks.markdown import markdown_table, ms
from gpu_checks.scale_models import alias_config, prepared_as_draft, random_draft
from gpu_checks.scale_sizes import DRAFT_ALIAS, TARGET_ALIAS, ScaleSizes
from gpu_checks.suite import release_memory
from gpu_checks.timing import synchronize
from gpu_checks.tree_passes import prefilled, random_tree, tree_pass
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from specchat.bounded_attention import bound_attention
from specchat.decoding.forward import CausalLM
from specchat.decoding.static_step import BUCKETS, static_draft
from specchat.plan.demand import shape_of

PROFILED_WIDTHS = (1, 64, 256)  # the step widths issue 48 bounds (1-256), the ends and a middle
TARGET_CACHED, TARGET_TREE = 4096, 2048  # the plan's default context and the largest tree a GPU's auto grows
KERNELS = 12  # the rows a width's table shows
STEPS = 3  # steps profiled a width; each row is their mean


@dataclass(frozen=True)
class Kernel:
    name: str
    ms: float  # device time a step (a CPU's: the op's own CPU time)
    calls: float  # a step


@dataclass(frozen=True)
class StepProfile:
    tokens: int
    kernels: list[Kernel]  # the most device time first
    device_ms: float  # every kernel's time a step
    wall_ms: float  # the profiled steps' wall time a step


def profiled_widths(sizes: ScaleSizes) -> tuple[int, ...]:
    return tuple(width for width in PROFILED_WIDTHS if width in sizes.draft_widths) or sizes.draft_widths[:1]


def profile_rows(sizes: ScaleSizes, device: torch.device) -> list[StepProfile]:
    """A step's profile at each profiled width, the whole draft of sizes.draft_layers layers."""
    config, _ = alias_config(DRAFT_ALIAS, sizes.draft_layers, sizes.draft_shrink)
    lm = CausalLM(prepared_as_draft(random_draft(config, device), "none", device))
    static = static_draft(lm, sizes.cached + max(sizes.draft_widths) + BUCKETS[-1], capture=False)
    try:
        cache = prefilled(static, sizes.cached)
        rows = []
        for n in profiled_widths(sizes):
            tree = random_tree(n, sizes.cached, config.vocab_size, seed=n)
            tree_pass(static, cache, sizes.cached, tree)  # its buffers made, its kernels compiled
            rows.append(step_profile(n, partial(tree_pass, static, cache, sizes.cached, tree), device))
        return rows
    finally:
        del lm, static
        release_memory()


def step_profile(tokens: int, step: Callable[[], object], device: torch.device) -> StepProfile:
    """`step` run STEPS times under the profiler."""
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]
    synchronize(device)
    with profile(activities=activities) as profiler:
        start = perf_counter()
        for _ in range(STEPS):
            step()
        synchronize(device)
        wall_ms = (perf_counter() - start) * 1e3
    kernels = kernel_times(profiler.key_averages(), device)
    return StepProfile(tokens, kernels[:KERNELS], sum(kernel.ms for kernel in kernels), wall_ms / STEPS)


def kernel_times(averages, device: torch.device) -> list[Kernel]:
    """Each kernel's time and calls a step, the most first: the device's kernels on CUDA, else the
    CPU's top-level ops (aten::, their own time)."""
    if device.type == "cuda":
        picked = [(event.key, event.self_device_time_total, event.count) for event in averages
                  if event.device_type == DeviceType.CUDA and event.self_device_time_total > 0]
    else:
        picked = [(event.key, event.self_cpu_time_total, event.count) for event in averages
                  if event.key.startswith("aten::") and event.self_cpu_time_total > 0]
    kernels = [Kernel(name, micros / 1e3 / STEPS, count / STEPS) for name, micros, count in picked]
    return sorted(kernels, key=lambda kernel: -kernel.ms)


@dataclass(frozen=True)
class TargetPass:
    cached: int
    tree: int
    peak_bytes: int | None  # allocated above the pass's start at its peak (None: no CUDA allocator to ask)
    math_peak_bytes: int | None  # the same with SDPA's math path alone
    planned_bytes: int  # what the plan reserves for a pass of its shape
    profile: StepProfile


def target_pass(sizes: ScaleSizes, device: torch.device) -> TargetPass:
    """One target-shaped layer's tree pass: its memory peak and its kernels (shrunk in a dry run)."""
    cached, tree = (sizes.cached, max(sizes.trees)) if sizes.dry_run else (TARGET_CACHED, TARGET_TREE)
    config, _ = alias_config(TARGET_ALIAS, 1, sizes.target_shrink)
    model = random_draft(config, device)
    bound_attention(model)
    lm = CausalLM(model)
    try:
        cache = prefilled(lm, cached)
        nodes = random_tree(tree, cached, config.vocab_size)
        run = partial(tree_pass, lm, cache, cached, nodes)
        run()  # its kernels chosen and compiled
        peak = peak_above_start(run, device)
        with sdpa_kernel(SDPBackend.MATH):
            math_peak = peak_above_start(run, device)
        return TargetPass(cached, tree, peak, math_peak, shape_of(config, lm.dtype).pass_bytes(cached, tree),
                          step_profile(tree, run, device))
    finally:
        del lm
        release_memory()


def peak_above_start(run: Callable[[], object], device: torch.device) -> int | None:
    """The most `run` holds allocated at once beyond what was allocated when it began, on CUDA."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    run()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def target_pass_table(target: TargetPass) -> str:
    peak, math_peak = (f"{value / 1e6:.1f} MB" if value is not None else "n/a (no CUDA allocator)"
                       for value in (target.peak_bytes, target.math_peak_bytes))
    return (f"a {TARGET_ALIAS} shaped layer's pass over {target.tree} tree tokens after {target.cached}: "
            f"{peak} allocated at its peak above its start ({math_peak} with SDPA's math path alone); the plan "
            f"reserves {target.planned_bytes / 1e6:.1f} MB for such a pass\n" + profile_tables([target.profile]))


def profile_tables(rows: list[StepProfile]) -> str:
    """A table a width: its kernels, then the step's device time against its wall time."""
    tables = []
    for row in rows:
        lines = [[short(kernel.name), ms(kernel.ms), f"{kernel.calls:g}", f"{kernel.ms / row.device_ms:.0%}"]
                 for kernel in row.kernels]
        lines.append(["every kernel, in all", ms(row.device_ms), "", "100%"])
        lines.append(["the step's wall time, eager under the profiler", ms(row.wall_ms), "", ""])
        tables.append(f"{row.tokens} tree tokens:\n" + markdown_table(["kernel", "ms a step", "calls a step", "share"],
                                                                      lines))
    return "\n\n".join(tables)


def short(name: str, width: int = 90) -> str:
    """A kernel's name cut to `width` characters (C++ template names run to hundreds), and no bars."""
    name = name.replace("|", "/")
    return name if len(name) <= width else name[:width - 3] + "..."
