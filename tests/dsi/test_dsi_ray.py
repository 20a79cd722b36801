"""DSI with its target workers as Ray actors: a local Ray cluster started on this machine, two
CPU actors that load the target themselves, and the same tokens as thread workers."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray
import torch
from helpers.cli import CORPUS, save_tiny_model
from transformers import Qwen2ForCausalLM

from specchat.decoding.events import SamplingParams
from specchat.engine_options import EngineOptions
from specchat.errors import SpecchatError
from specchat.loader import load_models
from specchat.runtime import live_settings_of

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

SAMPLINGS = [SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.95, 7)]
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command, whatever PATH holds
HEAD_START_S = 120
HEAD_STOP_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exited(head: subprocess.Popen) -> bool:
    """Whether the head has exited, without reaping it: while it is a zombie its pid, which is
    also its process group's id, cannot be given to another process."""
    return os.waitid(os.P_PID, head.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def stop_head(head: subprocess.Popen) -> None:
    """SIGTERM makes `ray start --block` stop the processes it started; whatever outlives it in
    its process group (ours alone: start_new_session) is then killed, and the head reaped."""
    os.kill(head.pid, signal.SIGTERM)  # not head.terminate(): it would reap the head if it had exited
    deadline = time.monotonic() + HEAD_STOP_S
    while not exited(head) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(head.pid, signal.SIGKILL)
    head.wait()


def start_head(temp_dir: Path) -> tuple[subprocess.Popen, str]:
    """`ray start --head --block` in its own session, temp dir and free ports: a cluster that
    is ours alone. Returns the process and the cluster's address once it is up."""
    port = free_port()
    with (temp_dir / "start.log").open("w") as log:
        head = subprocess.Popen(
            [*RAY_CLI, "start", "--head", "--block", f"--port={port}", f"--temp-dir={temp_dir}",
             f"--dashboard-agent-listen-port={free_port()}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats", "--object-store-memory=200000000"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + HEAD_START_S
    # `ray start` writes the address file once every process of the head is up.
    while not (temp_dir / "ray_current_cluster").exists():
        if exited(head) or time.monotonic() > deadline:
            stop_head(head)
            pytest.fail(f"the Ray head did not start:\n{(temp_dir / 'start.log').read_text()}")
        time.sleep(0.5)
    return head, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray head of our own; stopped (and this process disconnected) afterwards. Never
    `ray stop`: it ends every Ray cluster on the machine."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-"))  # short: Ray's socket paths must fit in 107 bytes
    try:
        head, address = start_head(temp_dir)
        try:
            yield address
        finally:
            if ray.is_initialized():
                ray.shutdown()
            stop_head(head)
    finally:
        shutil.rmtree(temp_dir)


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
