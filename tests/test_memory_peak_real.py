"""Issue 28, acceptance: a planned run stays within its plan. The default pair runs with every
layer streamed under a --ram-budget, in a process of its own, and its anonymous memory (what a
container's limit cannot reclaim: mapped checkpoint pages can be dropped and read again) is
sampled as it loads and decodes. Its peak stays within what the process held when it planned
(python, torch, transformers, the tokenizer) plus the plan's total, and a stated margin."""

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

# Below the default pair's whole size, every layer streamed: a ring of a few slots beside the bf16 LM
# head; then so little that the plan keeps the head in Q6_K and shrinks the tree (a 2 GB container's room)
RAM_BUDGETS_GB = {2.6: "ring of", 1.4: "LM head in its stored Q6_K"}  # and what the plan says it chose
# Allocator slack over the plan's tensors: the heap's freed blocks not yet reused, the
# tokenizer's and the engine's small objects. Measured here: 0.35 GB below the bound at 3.4 GB.
MARGIN = 0.05
PLANNED = re.compile(r"RAM under --ram-budget [\d.]+ GB: ([\d.]+) GB planned")
SAMPLE_S = 0.01  # the sampling period: a peak shorter than this can be missed, never invented


def anon_bytes(pid: int) -> int | None:
    """The process's resident anonymous memory (RssAnon), None once it has gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"RssAnon:\s+(\d+) kB", status)
    return None if found is None else int(found.group(1)) * 1024


class Sampler:
    """Samples a process's anonymous memory until it exits; remembers the reading taken when its
    plan was announced, and the peak."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.peak, self.latest, self.at_plan = process, 0, 0, None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.stopped = threading.Event()
        self.thread.start()

    def run(self) -> None:
        while not self.stopped.is_set():
            reading = anon_bytes(self.process.pid)
            if reading is None:
                return
            self.latest, self.peak = reading, max(self.peak, reading)
            self.stopped.wait(SAMPLE_S)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("ram_budget, chosen", RAM_BUDGETS_GB.items())
def test_a_disk_tier_run_stays_within_its_plan(tmp_path, ram_budget, chosen):
    command = [sys.executable, "-m", "specchat", "generate", "Explain what a mutex is.", "--offload", "disk",
               "--resident-layers", "0", "--ram-budget", str(ram_budget), "--budget", "16",
               "--offload-dir", str(tmp_path), "--max-new-tokens", "8", "--json"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sampler = Sampler(process)
    planned, lines = None, []
    for line in process.stderr:
        lines.append(line)
        found = PLANNED.search(line)
        if found and planned is None:
            planned, sampler.at_plan = float(found.group(1)) * 1e9, sampler.latest
    stdout = process.stdout.read()
    assert process.wait() == 0, "".join(lines[-5:])
    sampler.stopped.set()
    sampler.thread.join()
    assert '"new_tokens": 8' in stdout and chosen in "".join(lines)
    assert planned is not None and sampler.at_plan, "the run announced no plan"
    bound = sampler.at_plan + planned * (1 + MARGIN)
    assert sampler.peak <= bound, f"peak {sampler.peak / 1e9:.2f} GB over {bound / 1e9:.2f} GB " \
                                  f"({sampler.at_plan / 1e9:.2f} held at the plan + {planned / 1e9:.2f} planned)"
