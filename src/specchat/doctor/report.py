"""The `specchat doctor` report, as the terminal shows it."""

from specchat.doctor.advice import Recommendation
from specchat.doctor.facts import CudaDevice, Facts
from specchat.offload.placement import Placement
from specchat.transfer import gb


def render(facts: Facts, rec: Recommendation, placement: Placement | str) -> str:
    h2d = "no CUDA: skipped" if facts.h2d_gbps is None else f"{facts.h2d_gbps:.2f} GB/s (pinned memory)"
    mode = "O_DIRECT" if facts.direct else "O_DIRECT refused by the filesystem: buffered + fadvise DONTNEED"
    lines = [
        "devices",
        f"  cpu            {facts.cpu} ({facts.cores} cores, {facts.threads} threads)",
        f"  torch          {facts.torch_version}",
        *cuda_lines(facts.cuda),
        "memory",
        f"  ram            {gb(facts.ram_total)} total, {gb(facts.ram_available)} available",
        f"  disk           {gb(facts.disk_free)} free at {facts.offload_dir}",
        "bandwidth",
        f"  host->device   {h2d}",
        f"  disk read      {facts.disk_gbps:.2f} GB/s ({mode}; {gb(facts.probe_bytes)} probe)",
        "recommendation",
        f"  target         {facts.target}: {gb(facts.target_bytes)} in bfloat16",
        f"  offload        {rec.tier}",
        f"  budget         {rec.budget}",
        f"  why            {rec.reason}",
        *plan_lines(placement, facts),
    ]
    return "\n".join(lines)


def plan_lines(placement: Placement | str, facts: Facts) -> list[str]:
    """What --offload auto would do with the target: layers per tier, bytes and time per pass."""
    if isinstance(placement, str):
        return ["plan (--offload auto)", f"  fits nowhere   {placement}"]
    ram_gbps = facts.h2d_gbps  # pinned RAM streams to a GPU over PCIe
    seconds = placement.expected_pass_s(ram_gbps, facts.disk_gbps)
    timing = "no streaming: compute speed" if not placement.streamed else \
        "unknown (no measured link)" if seconds is None else f"~{seconds:.2f} s streaming per pass"
    return [
        "plan (--offload auto)",
        f"  layers         {placement.resident} resident, {placement.ram} in RAM, {placement.disk} on disk",
        f"  ring           {placement.slots} slots of {gb(placement.slot_bytes)}",
        f"  per pass       {gb(placement.pass_bytes)} streamed; {timing}",
        f"  device holds   {gb(placement.needed)} (weights, KV caches at the context length, the largest tree)",
    ]


def cuda_lines(devices: tuple[CudaDevice, ...]) -> list[str]:
    if not devices:
        return ["  cuda           no CUDA device"]
    return [f"  cuda:{i:<9} {d.name}: {gb(d.total)} total, {gb(d.free)} free" for i, d in enumerate(devices)]
