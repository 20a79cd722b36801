"""The loader's checks and steps: the draft quantization named against what the draft stores; the
options each engine reads; the plan announced (on stderr where layers stream or auto chose); the
target alone prepacked within the room its plan leaves, its bfloat16 linears widened from the rows
measured; its float32 linears routed through oneDNN over the spans measured for their shapes
(quant/onednn_float.py), named in the run's identity (the probe cache's key), as are the widths its
linears widen from, and a run with no plan keyed by its options alone; how many LM-head rows the
walk computes in one call, measured on that target's head (decoding/head_rows.py)."""

import math
from types import SimpleNamespace

import pytest
import torch
from helpers.cli import CORPUS, save_tiny_model
from torch import nn

from specchat import loader
from specchat.engine_options import DRAFT_QUANTS, EngineOptions
from specchat.errors import SpecchatError
from specchat.machine_links import Links
from specchat.progress import Reporter
from specchat.quant import onednn_float, prepacked
from specchat.quant.onednn_float import OneDnnLinear
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.widened import WidenedLinear, widen


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("pair")
    return str(save_tiny_model(root / "target", CORPUS, seed=0)), str(save_tiny_model(root / "draft", CORPUS, seed=1))


@pytest.mark.parametrize("measured", [1, 8])
def test_the_target_takes_the_head_rows_measured_on_its_own_head(pair, monkeypatch, measured):
    heads = []

    def measure(logits, hidden_size: int, dtype: torch.dtype, device: torch.device) -> int:
        heads.append((logits(torch.zeros(2, hidden_size, dtype=dtype)).shape, hidden_size, dtype, device.type))
        return measured

    monkeypatch.setattr(loader, "measure_head_rows", measure)
    target, draft = pair
    models = loader.load_models(EngineOptions(target=target, draft=draft, dtype="float32", draft_quant="none",
                                              offload="none"), progress=False)
    try:
        config = models.target.model.config
        assert models.target.head_rows == measured
        assert heads == [((2, config.vocab_size), config.hidden_size, torch.float32, models.device.type)]
    finally:
        models.close()


def test_a_float32_targets_linears_multiply_over_the_spans_measured_for_their_shapes(pair, monkeypatch):
    """Spans stood in for this CPU's: the down projection's (its 128 inputs) differs from the rest's."""
    monkeypatch.setattr(onednn_float, "onednn_span", lambda in_features, out_features, dtype: (2, in_features))
    monkeypatch.setattr(loader, "measure_head_rows", lambda logits, hidden_size, dtype, device: 1)
    target, draft = pair
    models = loader.load_models(EngineOptions(target=target, draft=draft, dtype="float32", draft_quant="none",
                                              offload="none"), progress=False)
    try:
        linears = [m for m in models.target.model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(isinstance(m, OneDnnLinear) and m.rows == (2, m.in_features) for m in linears)
        spans = sorted({m.rows for m in linears})
        assert len(spans) == 2 and models.identity["dense"] == f"oneDNN at {spans} rows"
        assert not any(isinstance(m, OneDnnLinear) for m in models.draft.model.modules())  # the target's alone
    finally:
        models.close()


def test_the_identity_names_every_width_the_targets_linears_widen_from():
    """Dense linears widened from 32 rows and a Q6_K one from 16: both counts are named, so that costs
    probed with either differ from these (decoding/probe.py's cache key)."""
    model = nn.Sequential(widen(nn.Linear(512, 32), 32), Q6Linear(512, 16), Q6Linear(512, 16), nn.Linear(512, 16))
    model[1].widened_from = 16
    assert loader.dense_products(SimpleNamespace(model=model)) == "widened from [16, 32] rows"
    model[0] = nn.Linear(512, 32)
    assert loader.dense_products(SimpleNamespace(model=model)) == "widened from [16] rows"
    model[1].widened_from = math.inf
    assert loader.dense_products(SimpleNamespace(model=model)) is None
    assert loader.dense_products(None) is None


@pytest.mark.parametrize("stored", [True, False], ids=["gptq-draft", "full-weights-draft"])
def test_the_draft_quant_named_is_checked_against_what_the_draft_stores(monkeypatch, stored):
    """auto takes any draft; a draft stored in 4 bits runs packed (none), expanded (dense) or in fp8 and
    nothing else; one stored in full weights has nothing to expand."""
    monkeypatch.setattr(loader, "read_config", lambda spec: {"_name_or_path": spec})
    monkeypatch.setattr(loader, "stores_4bit", lambda config: stored)
    monkeypatch.setattr(loader, "fp8_runs_on", lambda device: True)
    allowed = {"auto", "none", "dense", "fp8"} if stored else set(DRAFT_QUANTS) - {"dense"}
    for quant in DRAFT_QUANTS:
        options = EngineOptions(target="t", draft="d", draft_quant=quant)
        if quant in allowed:
            loader.check_draft_quant(options, torch.device("cpu"))
        else:
            with pytest.raises(SpecchatError, match=f"^--draft-quant {quant}"):
                loader.check_draft_quant(options, torch.device("cpu"))


def test_a_run_with_no_placement_and_no_plan_is_keyed_by_its_options_alone():
    """dsi over Ray actors: no placement here and no memory plan (the actors plan their own)."""
    options = EngineOptions(target="t", draft="d", offload="auto")
    key = loader.identity(options, None, None, None, None)
    assert key["offload"] == "none" and not {"placement", "head", "layers", "dense", "wide"} & set(key)
    assert key["draft_quant"] == options.draft_quant


def test_each_engine_reads_the_options_and_only_dsi_its_workers():
    options = EngineOptions(target="t", draft="d", engine="dsi", workers="cpu,cpu", ray_address="auto")
    assert loader.options_for(options, "dsi") == options
    specexec = loader.options_for(options, "specexec")
    assert (specexec.engine, specexec.workers, specexec.ray_address) == ("specexec", None, None)
    assert loader.options_for(EngineOptions(target="t"), "dsi").engine == "dsi"


def test_a_bfloat16_targets_linears_are_widened_from_the_rows_measured_and_named_in_the_identity(pair, monkeypatch):
    """This CPU's measurements stood in for: no prepacking pays, bfloat16 widens from 4 rows."""
    monkeypatch.setattr(prepacked, "prepack_pays", lambda dtype: False)
    monkeypatch.setattr(prepacked, "widened_rows", lambda dtype: 4 if dtype == torch.bfloat16 else None)
    monkeypatch.setattr(loader, "measure_head_rows", lambda logits, hidden_size, dtype, device: 1)
    target, draft = pair
    models = loader.load_models(EngineOptions(target=target, draft=draft, dtype="bfloat16", draft_quant="none",
                                              offload="none"), progress=False)
    try:
        linears = [m for m in models.target.model.modules() if isinstance(m, nn.Linear)]
        assert linears and all(isinstance(m, WidenedLinear) and m.from_rows == 4 for m in linears)
        assert models.identity["dense"] == "widened from [4] rows"
    finally:
        models.close()


def test_the_target_alone_is_prepacked_within_the_room_its_plan_leaves_free(pair, monkeypatch):
    """A weight's prepacked copy sits beside the plain one while it is repacked: the room is what the
    plan leaves of the device (here RAM) once it counted everything the run holds."""
    calls = []
    monkeypatch.setattr(loader, "prepack_linears", lambda model, room: calls.append((model, room)) or 0)
    monkeypatch.setattr(loader, "measure_head_rows", lambda logits, hidden_size, dtype, device: 1)
    target, draft = pair
    models = loader.load_models(EngineOptions(target=target, draft=draft, dtype="float32", draft_quant="none",
                                              offload="none"), progress=False)
    try:
        free = models.memory.rooms.device - models.memory.total("device")
        assert free > 0 and calls == [(models.target.model, free)]
    finally:
        models.close()


# (layers streamed, the plan's notes (auto's choices), layers on disk, the disk's measured GB/s)
ANNOUNCED = [((), (), 0, None), ((), ("auto chose",), 0, None), ((0, 1), (), 0, None), ((0, 1), (), 2, None),
             ((0, 1), (), 2, 1.3)]


@pytest.mark.parametrize(("streamed", "notes", "disk", "disk_gbps"), ANNOUNCED)
def test_the_plan_is_said_on_stderr_where_layers_stream_or_auto_chose_and_an_unmeasured_disk_points_to_doctor(
        monkeypatch, capsys, streamed, notes, disk, disk_gbps):
    monkeypatch.setattr(loader, "read_links", lambda: Links(disk_gbps=disk_gbps))
    monkeypatch.setattr(loader, "describe_plan", lambda memory, ram_gbps, disk_gbps: ["the plan, in a line"])
    memory = SimpleNamespace(placement=SimpleNamespace(streamed=streamed, disk=disk), notes=notes)
    steps = []
    loader.announce(memory, Reporter(True, lambda step, fraction: steps.append(step)))
    hint = [] if not disk or disk_gbps else ["run `specchat doctor` to measure the disk and see the expected pass time"]
    assert steps == ["the plan, in a line", *hint]
    assert capsys.readouterr().err.splitlines() == (["the plan, in a line", *hint] if streamed or notes else [])
