"""cuda_device: a GPU older than Ampere is left unused, said in one line, and everything that picks
a device (the loader, the plan, doctor, --vram-budget) takes the CPU instead. torch's CUDA queries
are stood in for: this machine has no GPU."""

import pytest
import torch
from helpers.gpus import TESLA_T4, seen_gpu

from specchat import cuda_device
from specchat.bench.machine import describe_machine
from specchat.cuda_device import cuda_usable, unused_gpu
from specchat.doctor.facts import cuda_devices
from specchat.dsi.workers import parse_devices
from specchat.engine_options import EngineOptions
from specchat.errors import SpecchatError
from specchat.offload.direct_io import aligned_empty
from specchat.offload.probe import measure_h2d_gbps
from specchat.plan import Machine
from specchat.runtime import pick_device, validate


@pytest.mark.parametrize(("capability", "usable"), [((7, 5), False), ((7, 0), False), ((8, 0), True), ((8, 9), True),
                                                    ((9, 0), True), ((12, 0), True), (None, False)])
def test_a_gpu_runs_specchat_from_compute_capability_8_0(monkeypatch, capability, usable):
    seen_gpu(monkeypatch, capability, "Tesla T4")
    assert cuda_usable() is usable
    assert (unused_gpu() is not None) is (capability is not None and not usable)


def test_an_older_gpu_is_named_with_its_capability_and_what_runs_instead(monkeypatch):
    seen_gpu(monkeypatch, TESLA_T4, "Tesla T4")
    assert unused_gpu() == ("the GPU here, Tesla T4 (compute capability 7.5), is older than specchat's bfloat16 and "
                            "4-bit kernels need (8.0, Ampere): it is left unused and the CPU runs the models")


def test_with_an_older_gpu_the_loader_plan_and_doctor_take_the_cpu(monkeypatch):
    seen_gpu(monkeypatch, TESLA_T4, "Tesla T4")
    assert pick_device() == torch.device("cpu") and Machine().device() == torch.device("cpu")
    assert cuda_devices() == () and measure_h2d_gbps() is None and describe_machine().endswith(", no GPU")
    assert not aligned_empty(4096, pin=True).is_pinned()  # no page-locked RAM for a GPU nothing copies to
    with pytest.raises(SpecchatError, match=r"^--vram-budget caps GPU memory, and the GPU here, Tesla T4 .* use "
                                            r"--ram-budget$"):
        validate(EngineOptions(vram_budget=8.0))
    with pytest.raises(SpecchatError, match=r"^--workers: cuda:0 is not available on this machine \(the GPU here, "
                                            r"Tesla T4 .*\)$"):
        parse_devices("cuda:0")


def test_with_an_ampere_gpu_the_loader_and_plan_take_it(monkeypatch):
    seen_gpu(monkeypatch, (8, 6), "NVIDIA GeForce RTX 3090")
    assert pick_device() == torch.device("cuda") and Machine().device() == torch.device("cuda")
    assert describe_machine().endswith(", NVIDIA GeForce RTX 3090")
    assert cuda_device.unused_gpu() is None
