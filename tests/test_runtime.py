"""runtime.py: the Models bundle's engines (which it offers, the tree shape each gets from the live
settings and the device, --budget auto's sizer and its cap on a GPU), the panels' transfer label,
what close stops; validate's checks before anything loads, the live settings named on the command
line, a raw prompt's tokens. (Auto's trees and probe cache: decoding/test_budget_auto.py; the
values' own checks: test_engine_options.py.)"""

import re

import pytest
import torch
from helpers.tiny import tiny_models

from specchat import runtime
from specchat.decoding.autosize import Costs
from specchat.decoding.events import AUTO, LiveSettings
from specchat.engine_options import EngineOptions
from specchat.errors import SpecchatError
from specchat.limits import auto_cap, default_budget
from specchat.offload.placement import Placement
from specchat.runtime import Models, encode_prompt, live_settings_of, validate

COSTS = Costs(target_n=(1, 129), target_s=(0.1, 0.1), draft_b=(1, 128), draft_s=(0.001, 0.001))


class Closable:
    """An offload or worker pool that records being closed."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def on_device(models: Models, device: str, offload: object = None) -> Models:
    """`models` as a run on `device` would hold them (no tensor moves: the engines are only built)."""
    models.device, models.offload = torch.device(device), offload
    return models


@pytest.mark.parametrize("draft, asked, offered", [
    (False, "specexec", "autoregressive"),
    (True, "dsi", "autoregressive, specexec, sd, specinfer"),
])
def test_an_engine_the_models_cannot_run_is_refused_naming_it_and_the_choices(tiny_target, tiny_draft, draft,
                                                                           asked, offered):
    models = tiny_models(tiny_target, tiny_draft if draft else None)
    with pytest.raises(SpecchatError) as refusal:
        models.engine(asked)
    assert str(refusal.value) == f"engine '{asked}' cannot run on the loaded models: choose one of {offered}"


def test_every_engine_the_models_offer_is_built_under_the_name_it_was_chosen_by(tiny_target, tiny_draft):
    """The TUI's /engine, the panels and serve's usage read an engine's name: it is the one asked for."""
    models = tiny_models(tiny_target, tiny_draft, costs=COSTS, workers=Closable())
    names = models.engine_names()
    assert names == ("autoregressive", "specexec", "sd", "specinfer", "dsi")
    assert tuple(models.engine(name).name for name in names) == names


@pytest.mark.parametrize("name, budget", [("sd", 12), ("specinfer", 12), ("specexec", 12), ("specexec", AUTO)])
def test_each_tree_engine_takes_the_depth_and_the_ranked_tree_it_is_given(tiny_target, tiny_draft, name, budget):
    settings = LiveSettings(budget=budget, depth=5, ranked_tree=True)
    shape = tiny_models(tiny_target, tiny_draft, costs=COSTS).engine(name, settings).shape
    assert (shape.max_depth, shape.ranked_tree) == (5, True)
    assert shape.budget == (auto_cap(cuda=False, offloaded=False) if budget == AUTO else 12)  # auto starts at its cap


@pytest.mark.parametrize("device, offloaded", [("cpu", False), ("cpu", True), ("cuda", False), ("cuda", True)])
@pytest.mark.parametrize("name", ["sd", "specinfer"])
def test_trees_other_than_specexecs_take_the_devices_default_size_for_auto(tiny_target, tiny_draft, name, device,
                                                                           offloaded):
    models = on_device(tiny_models(tiny_target, tiny_draft), device, Closable() if offloaded else None)
    engine = models.engine(name, LiveSettings(budget=AUTO))
    assert engine.shape.budget == default_budget(device == "cuda", offloaded)
    assert engine.shape.sizer is None and engine.sizer is None


@pytest.mark.parametrize("device, offloaded", [("cpu", False), ("cpu", True), ("cuda", False), ("cuda", True)])
def test_autos_largest_tree_is_the_devices_cap(tiny_target, tiny_draft, device, offloaded):
    models = on_device(tiny_models(tiny_target, tiny_draft), device, Closable() if offloaded else None)
    assert models.auto_cap() == auto_cap(device == "cuda", offloaded)


@pytest.mark.parametrize("costs, sized", [(COSTS, True), (None, False)])
def test_a_fixed_specexec_tree_keeps_a_sizer_for_auto_only_where_costs_were_probed(tiny_target, tiny_draft, costs,
                                                                                   sized):
    """With costs in hand, a live /budget auto can switch to them without a probe; without, a fixed
    budget does not probe."""
    engine = tiny_models(tiny_target, tiny_draft, costs=costs).engine("specexec", LiveSettings(budget=12))
    assert engine.shape.sizer is None and engine.shape.budget == 12
    assert (engine.sizer is not None) == sized


def test_the_transfer_label_is_where_the_placement_streams_from(tiny_target):
    models = tiny_models(tiny_target, None)
    assert models.transfer_label() == ""
    models.placement = Placement((100,) * 4, 1, 3, 0, slots=2, slot_bytes=4096, needed=0)
    assert models.transfer_label() == "RAM"


def test_close_stops_the_streamer_and_the_workers(tiny_target, tiny_draft):
    offload, workers = Closable(), Closable()
    models = tiny_models(tiny_target, tiny_draft, workers=workers)
    models.offload = offload
    models.close()
    assert offload.closed and workers.closed


def test_validate_checks_the_workers_devices_of_dsi_before_anything_loads():
    with pytest.raises(SpecchatError, match=r"^--workers: 'tpu' is not a device \(use cpu, cuda or cuda:N\)$"):
        validate(EngineOptions(engine="dsi", workers="cpu,tpu"))


@pytest.mark.parametrize("engine, address, imported", [("dsi", "ray://head:10001", True), ("dsi", None, False),
                                                       ("specexec", None, False)])
def test_validate_imports_ray_only_for_dsi_over_a_cluster(monkeypatch, engine, address, imported):
    imports = []
    monkeypatch.setattr(runtime, "import_ray", lambda: imports.append("ray"))
    validate(EngineOptions(engine=engine, ray_address=address))
    assert imports == (["ray"] if imported else [])


def test_validate_checks_the_models_it_names(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(SpecchatError, match=re.escape(str(missing))):
        validate(EngineOptions(target=str(missing)))


def test_the_live_settings_are_those_the_command_line_named():
    options = EngineOptions(budget=64, max_depth=7, lookahead=3, ranked_tree=True)
    assert live_settings_of(options) == LiveSettings(budget=64, depth=7, lookahead=3, ranked_tree=True)


class TemplatelessTokenizer:
    """A tokenizer without a chat template; `bos` (0) starts a text where special tokens are asked
    for, as Llama's does."""

    chat_template = None

    def __init__(self, bos: bool) -> None:
        self.bos = bos

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [0] * (self.bos and add_special_tokens) + [ord(char) for char in text]}


def test_a_raw_prompt_gets_the_tokenizers_special_tokens():
    assert encode_prompt(TemplatelessTokenizer(bos=True), "hi", raw=True) == [0, ord("h"), ord("i")]


def test_a_prompt_with_no_tokens_is_refused_in_one_line():
    with pytest.raises(SpecchatError, match=r"^the prompt is empty after tokenization: give some text$"):
        encode_prompt(TemplatelessTokenizer(bos=False), "", raw=True)
