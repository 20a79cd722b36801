"""cuda_graph on a CPU: nothing to capture, so work runs as it is (the capture itself is checked
on CUDA by the captured draft steps, gpu_checks/captured_draft.py), and a probe's replayed product
is the product."""

import torch

from specchat.cuda_graph import replayed
from specchat.quant.timing import as_replayed

CPU = torch.device("cpu")


def test_on_a_cpu_the_replay_is_the_run_itself():
    calls = []

    def run() -> torch.Tensor:
        calls.append(1)
        return torch.ones(1)

    assert replayed(run, CPU) is run and not calls  # nothing ran ahead: no warm-up, no capture


def test_on_a_cpu_a_probes_product_runs_at_each_width_as_called():
    widths = []

    def product(rows: int) -> torch.Tensor:
        widths.append(rows)
        return torch.ones(rows)

    replay = as_replayed(product, CPU)
    assert replay(3).shape == (3,) and replay(5).shape == (5,) and widths == [3, 5]
