"""Progress reports from model preparation: the tqdm adapter, the embedded-model stages on a tiny
fake GGUF, and their way to the TUI's loading screen."""

import pytest
import torch
from helpers.gguf_files import fake_draft, tiny_gguf  # noqa: F401  (fixtures: tiny GGUF split into fake parts)
from helpers.gpus import TESLA_T4, seen_gpu
from transformers import modeling_gguf_pytorch_utils as gguf_loading
from transformers.utils import logging as transformers_logging

from specchat.engine_options import EngineOptions
from specchat.loader import load_models
from specchat.models.embedded import EmbeddedModel, ensure_embedded
from specchat.models.registry import DEFAULT_DRAFT
from specchat.progress import Reporter, transformers_bars, worth_sending
from specchat.runtime import Models, pick_device
from specchat.tui import runtime_backend
from specchat.tui.settings import DecodingSettings


class Recorder:
    """A Report that keeps every (step, fraction) it receives."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None]] = []

    def __call__(self, step: str, fraction: float | None) -> None:
        self.calls.append((step, fraction))

    def fractions(self, prefix: str) -> list[float | None]:
        return [fraction for step, fraction in self.calls if step.startswith(prefix)]


def assert_rises_to_one(fractions: list[float | None]) -> None:
    assert fractions, "nothing reported"
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert fractions == sorted(fractions)


# The adapter


def test_bar_reports_its_fraction_without_drawing_when_bars_are_off(capfd):
    report = Recorder()
    with Reporter(bars=False, report=report).bar(total=200, desc="assembling x", mininterval=0) as bar:
        for _ in range(200):
            bar.update()
    assert {step for step, _ in report.calls} == {"assembling x"}
    assert_rises_to_one(report.fractions("assembling x"))
    assert len(report.calls) <= 22  # one line per 5% at most, plus start and end
    assert capfd.readouterr().err == ""


def test_bar_reports_its_postfix_as_part_of_the_step():
    report = Recorder()
    with Reporter(bars=False, report=report).bar(total=2, desc="converting x") as bar:
        bar.set_postfix_str("tokenizer")
        bar.update()
        bar.set_postfix_str("weights")
        bar.update()
    assert report.calls[:3] == [("converting x", 0.0), ("converting x: tokenizer", 0.0), ("converting x: weights", 0.5)]
    assert report.calls[-1] == ("converting x: weights", 1.0)


def test_bar_without_total_reports_no_fraction():
    report = Recorder()
    with Reporter(bars=False, report=report).bar(desc="counting") as bar:
        bar.update(5)
    assert report.calls == [("counting", None)]


def test_bars_on_stderr_are_drawn_as_before(capfd):
    report = Recorder()
    with Reporter(bars=True, report=report).bar(total=3, desc="assembling x") as bar:
        bar.update(3)
    assert "assembling x: 100%" in capfd.readouterr().err
    assert report.calls[-1] == ("assembling x", 1.0)


def test_no_bars_and_no_report_is_silent(capfd):
    with Reporter(bars=False).bar(total=3, desc="assembling x") as bar:
        bar.update(3)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    "last, state, sent",
    [
        (None, ("a", 0.0), True),
        (("a", 0.5), ("b", 0.5), True),
        (("a", 0.5), ("a", 0.52), False),
        (("a", 0.5), ("a", 0.55), True),
        (("a", 0.98), ("a", 1.0), True),
        (("a", 1.0), ("a", 1.0), False),
        (("a", None), ("a", None), False),
        (("a", None), ("a", 0.1), True),
    ],
)
def test_worth_sending(last, state, sent):
    assert worth_sending(last, state) == sent


def test_steps_and_notices_go_to_the_report(capfd):
    report = Recorder()
    Reporter(bars=False, report=report).step("ready", 1.0)
    Reporter(bars=False, report=report).notice("waiting")
    assert report.calls == [("ready", 1.0), ("waiting", None)]
    assert capfd.readouterr().err == ""
    Reporter(bars=True).notice("waiting")
    assert capfd.readouterr().err == "waiting\n"


def test_transformers_bars_are_routed_then_restored(capfd):
    report = Recorder()
    previous_gguf_tqdm = gguf_loading.tqdm
    with pytest.raises(RuntimeError), transformers_bars(Reporter(False, report), lambda desc: f"m: {desc.lower()}"):
        assert list(transformers_logging.tqdm(range(4), desc="Loading weights")) == [0, 1, 2, 3]
        list(gguf_loading.tqdm(range(2), desc="Converting and de-quantizing GGUF tensors..."))
        raise RuntimeError("a failed load must not leave the hook installed")
    assert_rises_to_one(report.fractions("m: loading weights"))
    assert_rises_to_one(report.fractions("m: dequantizing tensors"))
    assert capfd.readouterr().err == ""
    assert gguf_loading.tqdm is previous_gguf_tqdm
    assert transformers_logging.set_tqdm_hook(None) is None


def test_transformers_bars_stay_off_where_the_user_switched_them_off(capfd):
    report = Recorder()
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        with transformers_bars(Reporter(True, report), lambda desc: desc):
            list(transformers_logging.tqdm(range(3), desc="Loading weights"))
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()
    assert capfd.readouterr().err == ""
    assert report.fractions("Loading weights") == [0.0, 1.0]


# Model preparation on the tiny fake GGUF


def test_ensure_embedded_reports_assembling_and_converting(fake_draft: EmbeddedModel, capfd) -> None:  # noqa: F811
    report = Recorder()
    ensure_embedded(DEFAULT_DRAFT, progress=False, report=report)

    assert_rises_to_one(report.fractions("assembling tiny.gguf"))
    assert_rises_to_one(report.fractions("converting tiny: dequantizing tensors"))
    converting = [(step, fraction) for step, fraction in report.calls if step.startswith("converting tiny")]
    assert ("converting tiny: dequantizing", 0.25) in converting
    assert converting[-1][1] == 1.0
    assert capfd.readouterr().err.count("%|") == 0  # no tqdm bar reached stderr

    report.calls.clear()
    ensure_embedded(DEFAULT_DRAFT, progress=False, report=report)
    assert report.calls == []  # already converted: nothing to report


def test_load_models_reports_every_stage_up_to_ready(fake_draft: EmbeddedModel) -> None:  # noqa: F811
    report = Recorder()
    load_models(EngineOptions(target=DEFAULT_DRAFT, engine="autoregressive", dtype="float32"),
                progress=False, report=report)

    steps = [step for step, _ in report.calls]
    assert steps[0] == "planning memory"  # from the config, before anything is assembled or loaded
    assert next(step for step in steps if step.startswith("memory plan: ")) == "memory plan: context 4096 tokens, no draft"
    plan = next(step for step in steps if step.strip().endswith("nothing streams"))
    assert plan.endswith(" resident, 0 in RAM, 0 on disk; nothing streams")  # --offload auto, the default: it fits
    assert steps.index(plan) < steps.index(f"loading {DEFAULT_DRAFT}")
    assert_rises_to_one(report.fractions(f"loading {DEFAULT_DRAFT} weights"))
    assert steps.index("assembling tiny.gguf") < steps.index(f"loading {DEFAULT_DRAFT} weights")
    device = pick_device().type  # where load_models puts the model: cpu here, cuda on a GPU host
    assert report.calls[-2:] == [(f"moving {DEFAULT_DRAFT} to {device}", None), ("ready", 1.0)]


def test_load_models_says_first_why_an_older_gpu_is_left_unused(fake_draft: EmbeddedModel, monkeypatch,  # noqa: F811
                                                                   capfd) -> None:
    seen_gpu(monkeypatch, TESLA_T4, "Tesla T4")
    report = Recorder()
    models = load_models(EngineOptions(target=DEFAULT_DRAFT, engine="autoregressive", dtype="float32"),
                         progress=True, report=report)
    note = ("the GPU here, Tesla T4 (compute capability 7.5), is older than specchat's bfloat16 and 4-bit kernels "
            "need (8.0, Ampere): it is left unused and the CPU runs the models")
    assert report.calls[0] == (note, None) and note in capfd.readouterr().err  # on stderr too, once
    assert models.target.device == torch.device("cpu")


# The TUI's loader


def test_runtime_loader_forwards_the_steps_and_silences_stderr(tiny_target, monkeypatch) -> None:
    class ChatTokenizer:
        chat_template = "role: content"

    calls: list[dict] = []
    loaded: list[Models] = []

    def fake_load_models(options: EngineOptions, progress: bool, report) -> Models:
        calls.append({"options": options, "progress": progress})
        report("assembling tiny.gguf", 0.5)
        report("ready", 1.0)
        loaded.append(Models(tokenizer=ChatTokenizer(), stop_ids=frozenset(), device=torch.device("cpu"),
                             context=1024, target=tiny_target))
        return loaded[0]

    monkeypatch.setattr(runtime_backend, "load_models", fake_load_models)
    options = EngineOptions(engine="autoregressive")
    report = Recorder()
    backend = runtime_backend.runtime_loader(options, DecodingSettings())(report)

    assert report.calls == [("assembling tiny.gguf", 0.5), ("ready", 1.0)]
    assert calls == [{"options": options, "progress": False}]  # no bars: stderr stays quiet
    # The backend drives the models loaded behind the screen, with the engine the options name.
    assert backend.models is loaded[0] and backend.engine.name == "autoregressive"
    assert backend.engine_names == ("autoregressive",) and backend.name == options.target
