"""Issue 28, acceptance: a planned run stays within its plan. The default pair runs with every
layer streamed under a --ram-budget, in a process of its own, and its anonymous memory (what a
container's limit cannot reclaim: mapped checkpoint pages can be dropped and read again) is
sampled as it loads and decodes. Its peak stays within what the process held when it planned
(python, torch, transformers, the tokenizer) plus the plan's total, and a stated margin. What it
held is read by the process itself as it announces the plan (tests/helpers/anon_at_plan.py), before it
loads anything: read here once the line had arrived, it would include what loading had added."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import anon_at_plan
from helpers.anon_at_plan import AT_PLAN, PLANNED, anon_bytes

pytestmark = pytest.mark.real

# Below the default pair's whole size, every layer streamed: a ring of a few slots beside the bf16 LM
# head; then so little that the plan keeps the head in Q6_K and shrinks the tree (a 2 GB container's room)
RAM_BUDGETS_GB = {2.6: "ring of", 1.4: "LM head in its stored Q6_K"}  # and what the plan says it chose
# Allocator slack over the plan's tensors: the heap's freed blocks not yet reused, the
# tokenizer's and the engine's small objects. Measured here with the baseline read at the plan
# (0.49-0.50 GB): peaks of 2.60 and 1.65 GB against bounds of 3.20 and 1.97 GB at 2.6 and 1.4 GB.
MARGIN = 0.05
HELPER = Path(anon_at_plan.__file__)  # run as a script, by path
SAMPLE_S = 0.01  # the sampling period: a peak shorter than this can be missed, never invented


class Sampler:
    """Samples a process's anonymous memory until it exits; remembers the peak."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.peak = process, 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.stopped = threading.Event()
        self.thread.start()

    def run(self) -> None:
        while not self.stopped.is_set():
            reading = anon_bytes(Path(f"/proc/{self.process.pid}/status"))
            if reading is None:
                return
            self.peak = max(self.peak, reading)
            self.stopped.wait(SAMPLE_S)


def run_command(offload_dir: Path, ram_budget: float) -> list[str]:
    return [sys.executable, str(HELPER), "specchat", "generate", "Explain what a mutex is.", "--offload", "disk",
            "--resident-layers", "0", "--ram-budget", str(ram_budget), "--budget", "16",
            "--offload-dir", str(offload_dir), "--max-new-tokens", "8", "--json"]


@pytest.fixture(scope="module", autouse=True)
def warmed_up(tmp_path_factory) -> None:
    """One run, unsampled, first: on a new machine the first run makes what every later run reuses
    (the pair converted into the cache, its 4-bit target packed for this CPU, the draft's ranked
    vocabulary), once and outside any run's plan (measured on a fresh AMD EPYC VM: a 14.95 GB peak
    of anonymous memory against 3.20 GB planned)."""
    subprocess.run(run_command(tmp_path_factory.mktemp("warm-up"), max(RAM_BUDGETS_GB)), check=True,
                   capture_output=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("ram_budget, chosen", RAM_BUDGETS_GB.items())
def test_a_disk_tier_run_stays_within_its_plan(tmp_path, ram_budget, chosen):
    process = subprocess.Popen(run_command(tmp_path, ram_budget), stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    sampler = Sampler(process)
    stdout, stderr = process.communicate()
    assert process.returncode == 0, stderr[-2000:]
    sampler.stopped.set()
    sampler.thread.join()
    assert '"new_tokens": 8' in stdout and chosen in stderr
    planned, at_plan = PLANNED.search(stderr), AT_PLAN.search(stderr)
    assert planned is not None and at_plan is not None, "the run announced no plan"
    planned, at_plan = float(planned.group(1)) * 1e9, int(at_plan.group(1))
    bound = at_plan + planned * (1 + MARGIN)
    assert sampler.peak <= bound, f"peak {sampler.peak / 1e9:.2f} GB over {bound / 1e9:.2f} GB " \
                                  f"({at_plan / 1e9:.2f} held at the plan + {planned / 1e9:.2f} planned)"
