"""The `specchat doctor` report, as the terminal shows it."""

from specchat.doctor.advice import Recommendation
from specchat.doctor.facts import CudaDevice, Facts
from specchat.doctor.limit import Limit
from specchat.doctor.plan import TREE_SIZES, PairPlan, Routing, pass_timing
from specchat.plan import Machine
from specchat.transfer import gb


def render(facts: Facts, target: str, rec: Recommendation | None, pair: PairPlan | str, limit: Limit | None = None) -> str:
    """The report; `rec` is None when no plan fits (the plan's lines say why)."""
    h2d = "no CUDA: skipped" if facts.h2d_gbps is None else f"{facts.h2d_gbps:.2f} GB/s (pinned memory)"
    mode = "O_DIRECT" if facts.direct else "O_DIRECT refused by the filesystem: buffered + fadvise DONTNEED"
    lines = [
        "devices",
        f"  cpu            {facts.cpu} ({facts.cores} cores, {facts.threads} threads)",
        f"  torch          {facts.torch_version}",
        *cuda_lines(facts.cuda, facts.unused_gpu),
        "memory",
        f"  ram            {gb(facts.ram_total)} total, {gb(facts.ram_available)} available",
        f"  disk           {gb(facts.disk_free)} free at {facts.offload_dir}",
        "bandwidth",
        f"  host->device   {h2d}",
        f"  disk read      {facts.disk_gbps:.2f} GB/s ({mode}; {gb(facts.probe_bytes)} probe)",
        *recommendation_lines(target, rec, pair),
        *plan_lines(pair, facts.h2d_gbps, facts.disk_gbps),
        *limit_lines(limit),
    ]
    return "\n".join(lines)


def recommendation_lines(target: str, rec: Recommendation | None, pair: PairPlan | str) -> list[str]:
    if rec is None or isinstance(pair, str):
        return ["recommendation", f"  target         {target}: no plan fits this machine (below)"]
    return ["recommendation",
            f"  target         {target}: {gb(pair.memory.target_bytes())} of weights as the plan holds them",
            f"  offload        {rec.tier}",
            f"  budget         {rec.budget}",
            f"  why            {rec.reason}"]


def limit_lines(limit: Limit | None) -> list[str]:
    """The smallest memory limit (a container's) the pair plans to run in, on a CPU."""
    if limit is None:
        return []
    if limit.smallest is None:
        return ["memory limit", "  smallest       none: the pair fits under no memory limit here"]
    return ["memory limit",
            f"  smallest       {gb(limit.smallest)}: the smallest memory limit (docker run --memory) the plan fits, "
            f"every layer that does not fit streamed from the disk, specchat's runtime ({gb(limit.runtime)}: "
            "python, torch, transformers, the tokenizer) included (docs/memory.md)"]


def plan_lines(pair: PairPlan | str, ram_gbps: float | None, disk_gbps: float | None) -> list[str]:
    """What --offload auto would do with the pair: every byte per tier, the layers, a pass's bytes and
    time, and the speed the paper's generation rates give."""
    if isinstance(pair, str):
        return ["plan (--offload auto)", f"  fits nowhere   {pair}"]
    memory, placement = pair.memory, pair.memory.placement
    draft = "no draft" if memory.draft is None else f"draft in {memory.draft.form}"
    lines = ["plan (--offload auto)", f"  context        {memory.context} tokens, {draft}"]
    for tier, room in (("device", memory.rooms.device_name), ("host", memory.rooms.host_name)):
        if any(item.tier == tier for item in memory.items):
            lines.append(f"  {room}: {gb(memory.total(tier))} planned")
            lines += [f"    {item.what:<52} {gb(item.nbytes):>10}" for item in memory.items if item.tier == tier]
    lines += [
        f"  layers         {placement.resident} resident, {placement.ram} in RAM, {placement.disk} on disk",
        f"  ring           {placement.slots} slots of {gb(placement.slot_bytes)}",
        f"  per pass       {gb(placement.pass_bytes)} streamed; {pass_timing(pair, ram_gbps, disk_gbps)}",
        f"  expected       {expected_speed(pair)}",
        *routing_lines(pair.routing),
    ]
    return lines + [f"  auto           {note}" for note in memory.notes]


def routing_lines(routing: Routing | None) -> list[str]:
    """A MoE target's experts a pass routes to, and the bytes it streams, by tree size (a streamed
    layer moves its head and the experts routed to)."""
    if routing is None:
        return []
    touched = ", ".join(f"{n}: {count:.1f}" for n, count in zip(TREE_SIZES, routing.touched))
    streamed = ", ".join(f"{n}: {nbytes / 1e9:.2f}" for n, nbytes in zip(TREE_SIZES, routing.streamed))
    return [f"  experts        {routing.routed} of {routing.experts} a token; a pass over n tree tokens routes to "
            f"~({touched}) of them a layer",
            f"  by expert      a streamed layer moves its head and the experts routed to: ~({streamed}) GB a pass"]


def expected_speed(pair: PairPlan) -> str:
    if pair.tokens_per_s is None:
        return "not estimated (nothing streams, or a link speed is unknown)"
    speeds = "-".join(f"{speed:.1f}" for speed in pair.tokens_per_s)
    rates = "-".join(f"{rate:g}" for rate in pair.gen_rates.rates)
    if pair.drafting_s is None:
        over = "over the streamed pass; drafting and compute come on top"
    else:
        over = (f"over the streamed pass and a full tree's drafting ({pair.drafting_s:.2f} s at the step timed "
                "here); compute comes on top")
    return f"at most {speeds} tokens/s: {rates} tokens per pass ({pair.gen_rates.source}) {over}"


def cuda_lines(devices: tuple[CudaDevice, ...], unused: str | None) -> list[str]:
    if unused is not None:
        return [f"  cuda           {unused}"]
    if not devices:
        return ["  cuda           no CUDA device"]
    return [f"  cuda:{i:<9} {d.name}: {gb(d.total)} total, {gb(d.free)} free" for i, d in enumerate(devices)]


def render_described(machine: Machine, pair: PairPlan | str) -> str:
    """The plan on a machine described by its sizes (nothing measured)."""
    gpu = "no GPU" if machine.vram_gb is None else f"{machine.vram_gb:g} GB GPU"
    links = ", ".join(f"{name} {value:g} GB/s" for name, value in (("PCIe", machine.pcie_gbps),
                                                                   ("disk", machine.disk_gbps)) if value)
    lines = ["machine (described)", f"  memory         {gpu}, {machine.ram_gb:g} GB RAM",
             f"  links          {links or 'not given'}"]
    return "\n".join(lines + plan_lines(pair, machine.pcie_gbps, machine.disk_gbps))
