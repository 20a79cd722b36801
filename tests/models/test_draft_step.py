"""What a draft step costs in each form the plan weighs (models/draft_step.py): measured on this
machine on a few random layers, kept once per machine, measured again by doctor."""

import pytest
import torch
from helpers.tiny import tiny_qwen_config
from torch import nn

from specchat.doctor.choices import choice_lines
from specchat.machine_choices import Kept, kept_choices, machine_facts, write_kept
from specchat.models import draft_step
from specchat.models.draft import DraftQuant
from specchat.models.draft_approx import DraftApprox
from specchat.models.configs import read_config
from specchat.models.draft_attention import DraftAttention
from specchat.models.draft_step import (PROBE_LAYERS, StepCost, layer_inputs, measure_step, probe_model, run_layers,
                                       step_cost, timed_form)
from specchat.quant.int4 import Int4Linear
from specchat.quant.int8 import Int8Linear

CPU = torch.device("cpu")
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def fresh_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path / "probes"))


def test_a_step_is_linear_in_its_tokens_between_the_widths_measured():
    cost = StepCost(one_s=0.010, wide_s=0.050, wide=41)
    assert cost.seconds(1) == pytest.approx(0.010) and cost.seconds(41) == pytest.approx(0.050)
    assert cost.seconds(21) == pytest.approx(0.030) and cost.seconds(81) == pytest.approx(0.090)
    assert StepCost(0.02, 0.02, 1).seconds(64) == 0.02


@pytest.mark.parametrize(("kind", "linear"), [("int8", Int8Linear), ("int4", Int4Linear)])
def test_the_probe_is_a_few_of_the_drafts_layers_in_its_form(kind, linear):
    config = tiny_qwen_config(hidden_size=128, intermediate_size=256, num_hidden_layers=6)
    model = probe_model(config, DraftQuant(kind), BF16, CPU)
    assert len(model.model.layers) == PROBE_LAYERS
    assert all(any(isinstance(m, linear) for m in layer.modules()) for layer in model.model.layers)


def test_the_probe_times_layers_holding_transformers_random_weights():
    """The timed layers are drawn as transformers draws a model's (normal at the config's
    initializer_range, norms at one); only the embedding and head, never run, are left unwritten."""
    config = tiny_qwen_config(hidden_size=128, intermediate_size=256, num_hidden_layers=6)
    model = probe_model(config, DraftQuant("dense"), torch.float32, CPU)
    for layer in model.model.layers:
        assert torch.equal(layer.input_layernorm.weight, torch.ones(128))
        weight = layer.mlp.down_proj.weight
        assert torch.isfinite(weight).all() and weight.std().item() == pytest.approx(config.initializer_range, rel=0.1)


def test_a_step_is_measured_once_scaled_to_the_drafts_layers_and_kept(monkeypatch):
    measured = []

    def stand_in(config, quant, dtype, device, wide):
        measured.append((config.num_hidden_layers, quant, wide))
        return [0.010, 0.040]

    monkeypatch.setattr(draft_step, "measure_step", stand_in)
    first = step_cost("qwen2.5-coder-0.5b", DraftQuant("int4"), BF16, CPU, 43)
    again = step_cost("qwen2.5-coder-0.5b", DraftQuant("int4"), BF16, CPU, 43)
    assert first == again == StepCost(0.010, 0.040, 43)
    assert measured == [(24, DraftQuant("int4"), 43)]  # the shipped config's 24 layers: read once, measured once
    assert [kept.choice for kept in kept_choices()] == [draft_step.CHOICE]


def test_the_probe_runs_its_4_bit_linears_as_the_drafts_own_run():
    model = probe_model(tiny_qwen_config(hidden_size=128, intermediate_size=256), DraftQuant("int4"), BF16, CPU)
    linears = [module for module in model.modules() if isinstance(module, Int4Linear)]
    assert linears and all(linear.registers for linear in linears)  # on CUDA: int4_gemm where it is faster


def test_a_probe_prepared_as_on_cuda_steps(monkeypatch):
    """Its layers as a CUDA draft's (q/k/v stacked and rotated together, norms fused, grouped
    attention packed), here on the CPU: the probe's causal step without a cache runs them, and
    gives the rows transformers' layers give (float32)."""
    config = tiny_qwen_config(hidden_size=128, intermediate_size=256, num_hidden_layers=8)
    torch.manual_seed(0)
    plain = probe_model(config, DraftQuant("none"), torch.float32, CPU)
    monkeypatch.setattr(draft_step, "approximation", lambda quant, vocab, dtype, device: DraftApprox(
        False, None, dtype=dtype, device=torch.device("cuda")))
    torch.manual_seed(0)
    prepared = probe_model(config, DraftQuant("none"), torch.float32, CPU)
    assert all(isinstance(layer.self_attn, DraftAttention) for layer in prepared.model.layers)
    with torch.inference_mode():
        rows = []
        for model in (plain, prepared):
            torch.manual_seed(1)  # the same random hidden states
            rows.append(run_layers(model, *layer_inputs(model, 16, torch.float32, CPU)))
    # float32, states up to ~3.9: at most 2.4e-7 apart on the AMD EPYC (2026-11-29), the rotation's one rounding
    torch.testing.assert_close(rows[1], rows[0], rtol=0, atol=4.8e-7)


@pytest.mark.parametrize(("layers", "scale"), [(8, 2.0), (10, 2.5), (3, 1.0)])
def test_the_measurement_times_the_probe_and_scales_it_to_every_layer(monkeypatch, layers, scale):
    """The probe's PROBE_LAYERS layers (all of a draft with fewer) stand for the draft's every layer."""
    timed = []

    def stand_in(model, widths, dtype, device):
        timed.append((len(model.model.layers), widths))
        return [0.004, 0.012]

    monkeypatch.setattr(draft_step, "timed_layers", stand_in)
    config = tiny_qwen_config(hidden_size=128, intermediate_size=256, num_hidden_layers=layers)
    assert measure_step(config, DraftQuant("int4"), BF16, CPU, 16) == pytest.approx([0.004 * scale, 0.012 * scale])
    assert timed == [(min(PROBE_LAYERS, layers), (1, 16))]


def test_the_measurement_on_this_machine_gives_seconds():
    config = tiny_qwen_config(hidden_size=128, intermediate_size=256, num_hidden_layers=8)
    one_s, wide_s = measure_step(config, DraftQuant("int4"), BF16, CPU, 16)
    assert 0 < one_s and 0 < wide_s  # the figures are this machine's


def test_each_width_is_timed_as_one_capture_replayed(monkeypatch):
    """On CUDA `replayed` captures a width's layers once and times the replays; here it records
    what it was handed: one run a width, over that width's rows, on the probe's device."""
    handed = []

    def recording(run, device):
        handed.append((tuple(run().shape[:2]), device))  # one sequence of the width's rows, as a step
        return run

    monkeypatch.setattr(draft_step, "replayed", recording)
    measure_step(tiny_qwen_config(hidden_size=128, intermediate_size=256), DraftQuant("none"), BF16, CPU, 16)
    assert handed == [((1, 1), CPU), ((1, 16), CPU)]


def test_a_step_kept_before_steps_were_timed_replayed_is_measured_again(monkeypatch):
    """A CUDA figure kept from the eager probe (no "replayed" in its key) read fp8 at 2.8x its
    captured step: it is not reused."""
    eager_key = {"draft": "qwen2.5-coder-0.5b", "quant": "int4", "dense_above": None, "dtype": str(BF16), "wide": 43}
    write_kept(Kept(draft_step.CHOICE, eager_key, [0.5, 0.9], 0.0, "cpu", machine_facts(CPU)))
    monkeypatch.setattr(draft_step, "measure_step", lambda *args: [0.010, 0.040])
    assert step_cost("qwen2.5-coder-0.5b", DraftQuant("int4"), BF16, CPU, 43) == StepCost(0.010, 0.040, 43)
    assert {kept.key.get("replayed") for kept in kept_choices()} == {None, False}


def test_forms_not_timed_here_have_no_cost(monkeypatch):
    """nf4 runs on bitsandbytes alone."""
    monkeypatch.setattr(draft_step, "measure_step", lambda *args: pytest.fail("measured"))
    assert step_cost("qwen2.5-coder-0.5b", DraftQuant("nf4"), BF16, CPU, 43) is None


@pytest.mark.parametrize(("kind", "timed_as", "linear"), [("none", "int4", Int4Linear), ("dense", "none", nn.Linear)])
def test_a_draft_stored_in_4_bits_is_timed_as_its_dense_config_packed_or_expanded(monkeypatch, kind, timed_as, linear):
    """llama-3.1-8b-awq: packed (none), its probe's linears rounded to 4 bits, the stored
    Int4Linears' kernels; expanded (dense), full weights."""
    config = read_config("llama-3.1-8b-awq")
    probed, quant = timed_form(config, DraftQuant(kind))
    assert quant == DraftQuant(timed_as) and getattr(probed, "quantization_config", None) is None
    assert probed.num_hidden_layers == 32 and probed.intermediate_size == 14336
    small = probed.__class__.from_dict(probed.to_dict() | {"hidden_size": 128, "intermediate_size": 256,
                                                          "num_attention_heads": 4, "num_key_value_heads": 2})
    layer = probe_model(small, quant, BF16, CPU).model.layers[0]
    assert type(layer.mlp.down_proj) is linear
    monkeypatch.setattr(draft_step, "measure_kept", lambda key, device: [0.010, 0.040])
    assert step_cost("llama-3.1-8b-awq", DraftQuant(kind), BF16, CPU, 43) == StepCost(0.010, 0.040, 43)


def test_doctor_measures_a_kept_step_again(monkeypatch):
    readings = iter([[0.010, 0.040], [0.020, 0.080]])
    monkeypatch.setattr(draft_step, "measure_step", lambda *args: next(readings))
    step_cost("qwen2.5-coder-0.5b", DraftQuant("int8", 16), BF16, CPU, 43)
    lines = choice_lines(again=True)
    assert any(line.strip().startswith("draft step") and "[0.02, 0.08]" in line and "dense_above=16" in line
               for line in lines), lines
    assert step_cost("qwen2.5-coder-0.5b", DraftQuant("int8", 16), BF16, CPU, 43) == StepCost(0.020, 0.080, 43)
