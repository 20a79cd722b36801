"""DSI with its target workers as Ray actors: a local Ray cluster started on this machine, two
CPU actors that load the target themselves, and the same tokens as thread workers."""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch
from test_cli import CORPUS, save_tiny_model
from transformers import Qwen2ForCausalLM

from specchat.decoding.events import SamplingParams
from specchat.errors import SpecchatError
from specchat.runtime import EngineOptions, live_settings_of, load_models

SAMPLINGS = [SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.95, 7)]
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command, whatever PATH holds


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """`ray start --head` on a free port; stopped (and this process disconnected) afterwards."""
    port = free_port()
    subprocess.run(
        [*RAY_CLI, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats", "--object-store-memory=200000000"],
        check=True, capture_output=True,
    )
    yield f"127.0.0.1:{port}"
    if ray.is_initialized():
        ray.shutdown()
    subprocess.run([*RAY_CLI, "stop", "--force"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny target and, as its draft, a noisy copy of it: drafts are sometimes accepted."""
    root = tmp_path_factory.mktemp("dsi-ray")
    target = save_tiny_model(root / "target", CORPUS, seed=0)
    draft = Qwen2ForCausalLM.from_pretrained(target)
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(0.3 * parameter.std() * torch.randn_like(parameter))
    draft.save_pretrained(root / "draft")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target / name, root / "draft" / name)
    return target, root / "draft"


def cpus_free_within(seconds: float) -> float:
    """The cluster's free CPUs once both are free again, or after `seconds` (actors die asynchronously)."""
    deadline = time.monotonic() + seconds
    while (free := ray.available_resources().get("CPU", 0.0)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    return free


def reply_tokens(options: EngineOptions, sampling: SamplingParams) -> tuple[list[int], list]:
    models = load_models(options, progress=False)
    try:
        prompt = models.tokenizer("the quick brown fox")["input_ids"]
        events = list(models.engine("dsi", live_settings_of(options)).generate(prompt, 40, sampling))
    finally:
        models.close()
    return [t for e in events for t in e.token_ids], events


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_ray_workers_give_the_thread_workers_tokens(ray_cluster, pair_dirs, sampling):
    target, draft = pair_dirs
    options = EngineOptions(target=str(target), draft=str(draft), engine="dsi", dtype="float32",
                            lookahead=2, workers="cpu,cpu")
    by_threads, _ = reply_tokens(options, sampling)
    by_ray, events = reply_tokens(EngineOptions(**{**vars(options), "ray_address": ray_cluster}), sampling)
    assert by_ray == by_threads and len(by_ray) == 40
    assert sum(e.jobs_submitted for e in events) >= len(events)
    assert cpus_free_within(30.0) == 2  # closing the runtime killed both actors


def test_no_cluster_is_one_clear_error(pair_dirs):
    target, draft = pair_dirs
    options = EngineOptions(target=str(target), draft=str(draft), engine="dsi", ray_address=f"127.0.0.1:{free_port()}")
    with pytest.raises(SpecchatError, match="no Ray cluster at --ray-address 127.0.0.1:"):
        load_models(options, progress=False)


def test_more_workers_than_the_cluster_holds_is_one_clear_error(ray_cluster, pair_dirs):
    target, draft = pair_dirs
    options = EngineOptions(target=str(target), draft=str(draft), engine="dsi", workers="cpu,cpu,cpu",
                            ray_address=ray_cluster)
    with pytest.raises(SpecchatError, match="asks for 3 CPU workers, but the Ray cluster has 2 CPUs"):
        load_models(options, progress=False)
