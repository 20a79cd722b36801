"""The `specchat doctor` report, as the terminal shows it."""

from specchat.doctor.advice import Recommendation
from specchat.doctor.facts import CudaDevice, Facts
from specchat.transfer import gb


def render(facts: Facts, rec: Recommendation) -> str:
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
    ]
    return "\n".join(lines)


def cuda_lines(devices: tuple[CudaDevice, ...]) -> list[str]:
    if not devices:
        return ["  cuda           no CUDA device"]
    return [f"  cuda:{i:<9} {d.name}: {gb(d.total)} total, {gb(d.free)} free" for i, d in enumerate(devices)]
