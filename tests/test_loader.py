"""The loader's checks and steps: the draft quantization named against what the draft stores; the
options each engine reads; the plan announced (on stderr where layers stream or auto chose); the
target alone prepacked within the room its plan leaves, its bfloat16 linears widened from the rows
measured; its float32 linears routed through oneDNN over the spans measured for their shapes
(quant/onednn_float.py), named in the run's identity (the probe cache's key), as are the widths its
linears widen from, and a run with no plan keyed by its options alone; how many LM-head rows the
walk computes in one call, measured on that target's head (decoding/head_rows.py). Before anything
loads: every engine asked for validated, dsi's worker options refused without dsi, dsi's target
planned in memory, the draft's quantization checked where an engine drafts."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from helpers.cli import CORPUS, save_tiny_model
from helpers.recorded import Recorded
from torch import nn

from specchat import loader
from specchat.engine_options import DRAFT_QUANTS, EngineOptions
from specchat.errors import SpecchatError
from specchat.machine_links import Links
from specchat.models.local import local_tokenizer
from specchat.models.vocab_rank import RANK_FILE
from specchat.progress import Reporter
from specchat.quant import onednn_float, prepacked
from specchat.quant.onednn_float import OneDnnLinear
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.widened import WidenedLinear, widen
from specchat.runtime import Models


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


def stop_at_the_plan(monkeypatch) -> list[EngineOptions]:
    """Let load_models run up to the memory plan, record the options it plans with, and stop there
    (nothing loaded yet)."""
    planned = []

    def plan(options: EngineOptions, device: torch.device, drafted: bool, reporter: Reporter,
             conversations: int | None = 1) -> None:
        planned.append(options)
        raise Recorded

    monkeypatch.setattr(loader, "local_tokenizer", lambda target, weights: None)
    monkeypatch.setattr(loader, "plan_run", plan)
    return planned


@pytest.mark.parametrize("dsi_options", [dict(workers="cpu,cpu"), dict(ray_address="auto")])
def test_dsis_worker_options_are_refused_unless_dsi_is_among_the_engines(pair, monkeypatch, dsi_options):
    stop_at_the_plan(monkeypatch)
    target, draft = pair
    with pytest.raises(SpecchatError, match=r"^--workers and --ray-address are for --engine dsi$"):
        loader.load_models(EngineOptions(target=target, draft=draft, **dsi_options), engines=("sd",), progress=False)


def test_every_engine_asked_for_is_validated_before_anything_loads(pair, monkeypatch):
    stop_at_the_plan(monkeypatch)
    target, draft = pair
    with pytest.raises(SpecchatError, match=r"^--budget auto is for the specexec engine, not sd$"):
        loader.load_models(EngineOptions(target=target, draft=draft, budget="auto"), engines=("sd",), progress=False)


@pytest.mark.parametrize("engines, offload, planned_offload", [
    (("dsi",), "auto", "none"),  # dsi's workers share one target in memory
    (("dsi",), "none", "none"),
    ((), "auto", "auto"),
])
def test_with_dsi_the_target_is_planned_in_memory_where_offload_was_left_to_auto(pair, monkeypatch, engines, offload,
                                                                                 planned_offload):
    planned = stop_at_the_plan(monkeypatch)
    target, draft = pair
    with pytest.raises(Recorded):
        loader.load_models(EngineOptions(target=target, draft=draft, offload=offload, workers="cpu,cpu" if engines
                                         else None), engines=engines, progress=False)
    assert [options.offload for options in planned] == [planned_offload]


DRAFT_QUANT_REFUSALS = [
    ("nf4", r"^--draft-quant nf4 needs a CUDA device"),  # where bitsandbytes' kernels run
    ("dense", r"^--draft-quant dense expands a draft stored in 4 bits"),  # what the draft stores
]


@pytest.mark.parametrize("draft_quant, refusal", DRAFT_QUANT_REFUSALS)
def test_the_drafts_quantization_is_checked_before_anything_loads(pair, monkeypatch, draft_quant, refusal):
    planned = stop_at_the_plan(monkeypatch)
    target, draft = pair
    with pytest.raises(SpecchatError, match=refusal):
        loader.load_models(EngineOptions(target=target, draft=draft, draft_quant=draft_quant), progress=False)
    assert planned == []


@pytest.mark.parametrize("draft_quant", [quant for quant, _ in DRAFT_QUANT_REFUSALS])
def test_an_engine_without_a_draft_does_not_check_its_quantization(pair, monkeypatch, draft_quant):
    planned = stop_at_the_plan(monkeypatch)
    target, draft = pair
    with pytest.raises(Recorded):
        loader.load_models(EngineOptions(target=target, draft=draft, engine="autoregressive", draft_quant=draft_quant),
                           progress=False)
    assert len(planned) == 1


def load_drafted(pair: tuple[str, str], report: list, **fields: object):
    """The tiny pair loaded as a SpecExec run on this CPU would load it, every report kept."""
    target, draft = pair
    options = EngineOptions(target=target, draft=draft, dtype="float32", draft_quant="none", offload="none",
                            **fields)
    return loader.load_models(options, progress=False, report=lambda step, share: report.append((step, share)))


def test_a_drafted_run_keeps_its_tokenizer_and_caps_the_drafts_cache_and_head(pair, monkeypatch, tmp_path):
    draft = save_tiny_model(tmp_path / "draft", CORPUS, seed=1)
    rows = json.loads((draft / "config.json").read_text())["vocab_size"]
    (draft / RANK_FILE).write_text(json.dumps(list(range(rows))))  # its tokens ranked: no corpus to count
    given = []
    monkeypatch.setattr(loader, "local_tokenizer", lambda *spec: given.append(local_tokenizer(*spec)) or given[-1])
    report = []
    models = load_drafted((pair[0], str(draft)), report, budget=8, draft_vocab=20)
    try:
        assert given and models.tokenizer is given[0]  # held before the plan, not loaded again with the target
        # the context and the largest tree with its root; a CPU's eager steps pad no rows
        assert models.draft.capacity == models.context + models.max_budget() + 1
        assert models.draft.vocab.tolist() == list(range(20))  # and EOS (0) among them
        assert any(step.startswith(f"loading the draft {draft} (") and step.endswith(", 20-token head)")
                   for step, _ in report)
    finally:
        models.close()


PROBING = "measuring this machine's costs for --budget auto (once per machine and models)"


@pytest.mark.parametrize("fields, probed", [
    (dict(budget=None), True),  # SpecExec's default: auto
    (dict(budget="auto"), True),
    (dict(budget=8), False),
    (dict(budget=None, engine="autoregressive"), False),
])
def test_autos_costs_are_measured_while_loading_where_specexec_sizes_its_trees(pair, monkeypatch, fields, probed):
    """The probe itself stood in for (decoding/test_probe.py): only whether and how it is reported."""
    def probe(models: Models, done) -> None:
        done(0.5)

    monkeypatch.setattr(Models, "sizer", probe)
    report = []
    load_drafted(pair, report, **fields).close()
    assert [(step, share) for step, share in report if step == PROBING] == ([(PROBING, None), (PROBING, 0.5)] if probed
                                                                            else [])
    assert report[-1] == ("ready", 1.0)


def test_a_load_that_fails_after_the_target_loaded_closes_what_it_holds(pair, monkeypatch):
    closed = []

    def fail(models: Models, done) -> None:
        raise Recorded

    monkeypatch.setattr(Models, "sizer", fail)
    monkeypatch.setattr(Models, "close", lambda models: closed.append(models))
    with pytest.raises(Recorded):
        load_drafted(pair, [])  # auto: the costs measured last, after both models loaded
    assert len(closed) == 1 and closed[0].draft is not None
