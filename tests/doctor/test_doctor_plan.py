"""`specchat doctor --target M --draft M` on a described machine: offline, from the shipped
configs, the plan tier by tier and the expected speed; and `--context` checked before any load."""

import re
from dataclasses import replace

import pytest
from helpers.cli import assert_one_line_error, run_cli

import specchat.doctor.plan as doctor_module
from specchat.doctor.plan import doctor_options, doctor_plan
from specchat.doctor.report import expected_speed
from specchat.engine_options import EngineOptions
from specchat.models.configs import read_config, shipped_config_path
from specchat.models.draft_step import StepCost
from specchat.models.registry import ALIASES
from specchat.plan import Machine, plan_pair


@pytest.fixture(autouse=True)
def offline(monkeypatch) -> None:
    """No hub: the plan must come from the shipped configs."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_every_alias_ships_a_config_that_transformers_reads():
    for alias in ALIASES.values():
        assert shipped_config_path(alias.name).is_file(), alias.name
        config = read_config(alias.name)
        assert config.num_hidden_layers > 0 and config.max_position_embeddings >= 4096


def test_doctor_asks_for_what_run_would_be_given(tmp_path):
    """doctor's --offload-dir and budgets reach the options; no draft is the autoregressive engine."""
    options = doctor_options("t", None, 2048, tmp_path, ram_budget=3.0, vram_budget=20.0)
    assert (options.engine, options.context) == ("autoregressive", 2048)
    assert (options.offload_dir, options.ram_budget, options.vram_budget) == (str(tmp_path), 3.0, 20.0)
    assert doctor_options("t", "d", None, tmp_path).engine == EngineOptions(target="t").engine


def test_the_papers_pair_on_a_24_gb_card_is_planned_offline(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "llama-2-70b-gptq", "--draft", "llama-2-7b",
                           "--vram-gb", "24", "--ram-gb", "64", "--pcie-gbps", "25")
    assert code == 0
    lines = out.splitlines()
    assert "machine (described)" in lines and "plan (--offload auto)" in lines
    # int4 (3.97 GB and its layer in preparation, 0.46 GB) and nf4 (4.17 GB) leave room for as many
    # resident layers (the input embedding on the host): the first of equals, int4, is taken
    assert "  context        4096 tokens, draft in int4" in lines
    assert "int4: 24.74 GB, nf4: 24.74 GB)" in out  # 56 layers of 442 MB streamed
    planned = re.search(r"GPU memory \(24\.00 GB\): ([\d.]+) GB planned", out)
    assert planned and float(planned.group(1)) <= 24.0
    assert re.search(r"^  per pass       [\d.]+ GB streamed; ~[\d.]+ s streaming per pass at 25\.00 GB/s from RAM$",
                     out, re.M)
    assert re.search(r"^  expected       at most [\d.]+-[\d.]+ tokens/s", out, re.M)
    for what in ("draft weights (int4)", "draft KV cache", "target KV cache", "largest pass", "pinned RAM",
                 "CUDA context"):
        assert what in out
    # the bytes, from the config's arithmetic: a 4-bit act-order layer (group -1: kernel groups of 256)
    # holds nibbles, a bf16 scale and zero per group and output, the int64 permutation, two bf16 norms
    linears = [(8192, 8192), (8192, 1024), (8192, 1024), (8192, 8192), (8192, 28672), (8192, 28672), (28672, 8192)]
    layer = sum(i * o // 2 + i // 256 * o * 2 * 2 + i * 8 for i, o in linears) + 2 * 8192 * 2
    streamed = int(re.search(r"^  layers         (\d+) resident, (\d+) in RAM", out, re.M).group(2))
    assert f"  per pass       {streamed * layer / 1e9:.2f} GB streamed;" in out
    kv = 80 * 2 * 8 * 128 * 2 * (4096 + 2049)  # the target's KV cache: 320 KiB a token over context and tree
    assert re.search(rf"^    target KV cache \(6145 tokens\) +{kv / 1e9:.2f} GB$", out, re.M)


def test_where_the_drafts_step_was_timed_the_expected_speed_counts_a_full_trees_drafting(monkeypatch, tmp_path):
    """On the machine itself the plan holds the draft's step as timed there (a stand-in here, put
    on the described card's plan): the speed is the paper's rates over the pass and 24 steps of
    ceil(1024 / 24) = 43 tokens."""
    step = StepCost(0.004, 0.008, 43)

    def timed(*args):
        memory = plan_pair(*args)
        return replace(memory, draft=replace(memory.draft, step=step))

    monkeypatch.setattr(doctor_module, "plan_pair", timed)
    machine = Machine(vram_gb=24, ram_gb=64, pcie_gbps=25)
    pair = doctor_plan(doctor_options("llama-2-70b-gptq", "llama-2-7b", None, tmp_path), machine)
    assert pair.drafting_s == pytest.approx(24 * 0.008)
    assert pair.tokens_per_s == pytest.approx((8 / (pair.pass_s + 0.192), 20 / (pair.pass_s + 0.192)))
    assert "a full tree's drafting (0.19 s at the step timed here); compute comes on top" in expected_speed(pair)


def test_llama_3_70b_at_8192_tokens_streams_from_disk_and_says_the_disk_speed_is_unknown(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "llama-3-70b", "--draft", "llama-3-8b",
                           "--context", "8192", "--vram-gb", "24", "--ram-gb", "64", "--pcie-gbps", "25")
    assert code == 0
    assert "  context        8192 tokens, draft in int4" in out  # nf4 streams as much
    layers = re.search(r"^  layers         (\d+) resident, (\d+) in RAM, (\d+) on disk$", out, re.M)
    assert layers and int(layers.group(3)) > 0  # 141 GB of bf16 weights do not fit in 64 GB
    assert "unknown (no measured or given link speed" in out


def test_a_pair_that_fits_nowhere_is_a_line_of_the_report(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "qwen2.5-72b-gptq", "--draft", "qwen2.5-7b",
                           "--vram-gb", "8", "--ram-gb", "32")  # 10 GB hold it, its draft's input embedding on the host
    assert code == 0
    assert re.search(r"^  fits nowhere   GPU memory \(8\.00 GB\) is [\d.]+ GB short: "
                     r".*a smaller draft would fit, or none \(--engine autoregressive\)$", out, re.M)


@pytest.mark.parametrize(("args", "fragment"), [
    (("--vram-gb", "24"), "--vram-gb describes a GPU machine: give its RAM with --ram-gb too"),
    (("--ram-gb", "-1"), "--ram-gb must be a positive number"),
    (("--ram-gb", "64", "--context", "9000"), "--context 9000 is past the target's maximum of 4096 tokens"),
])
def test_bad_doctor_options_are_one_line(monkeypatch, capsys, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "doctor", "--target", "llama-2-70b-gptq", "--draft", "llama-2-7b",
                           *args)
    assert_one_line_error(code, err, fragment)


def test_generate_refuses_a_context_past_the_models_maximum_before_loading(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--context", "40000")
    assert_one_line_error(code, err, "--context 40000 is past the target's maximum of 32768 tokens")
    assert "loading" not in err


def gb(count: float) -> str:
    return f"{count / 1e9:.2f} GB"


def planned_item(out: str, label: str) -> float:
    """The bytes of the GPU plan's item `label`, as the report prints them (two decimals of GB)."""
    return float(re.search(rf"^    {re.escape(label)} +([\d.]+) GB$", out, re.M).group(1)) * 1e9


def awq_layer_bytes(hidden: int, mlp: int, kv_heads: int, head_dim: int) -> int:
    """A Llama decoder layer in specchat's packed 4-bit form at group 128: half a byte a weight, a
    bf16 scale and zero per group of 128 inputs and output, two bf16 norms."""
    kv = kv_heads * head_dim
    weights = hidden * (hidden + 2 * kv + hidden + 2 * mlp) + mlp * hidden
    return weights // 2 + weights // 128 * 4 + 2 * hidden * 2


def test_llama_3_1_70b_awq_fills_a_24_gb_card_with_resident_layers(monkeypatch, capsys):
    """Every GB the rest of the plan leaves on a 24 GB card holds target layers: the resident count
    is the most layers that fit beside the items, each item worked out from the configs' sizes here
    (those the configs do not give, the pass's activations, the kernels' workspace and the CUDA
    margin, are taken from the report)."""
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "llama-3.1-70b-awq", "--draft",
                           "llama-3.1-8b-awq", "--vram-gb", "24", "--ram-gb", "64", "--pcie-gbps", "25")
    assert code == 0
    vocab, tokens = 128256, 4096 + 2049  # context and the largest tree's pass
    layer = awq_layer_bytes(8192, 28672, 8, 128)  # 0.4545 GB
    draft_layer = awq_layer_bytes(4096, 14336, 8, 128)
    # the draft: 32 packed layers, an LM head over the 32768-token sub-vocabulary, a norm (its input
    # embedding, like the target's, on the host)
    items = {
        "fixed parts (final norm, LM head)": vocab * 8192 * 2 + 8192 * 2,  # the input embedding on the host
        f"target KV cache ({tokens} tokens)": 80 * 2 * 8 * 128 * 2 * tokens,
        "draft weights (none)": 32 * draft_layer + 32768 * 4096 * 2 + 4096 * 2,
        f"draft KV cache ({tokens} tokens)": 32 * 2 * 8 * 128 * 2 * tokens,
        "ring of 2 slots": 2 * layer,
    }
    for label, size in items.items():
        assert re.search(rf"^    {re.escape(label)} +{gb(size)}$", out, re.M), label
    assert re.search(rf"^    fixed parts: the input embedding +{gb(vocab * 8192 * 2)}$", out, re.M)  # in RAM
    assert re.search(rf"^    the draft's input embedding, looked up on the host +{gb(vocab * 4096 * 2)}$", out, re.M)
    others = sum(planned_item(out, label) for label in ("largest pass (2049-token tree)",
                                                        "quantized kernels' workspace",
                                                        "CUDA context and allocator margin"))
    spare = 24e9 - sum(items.values()) - others
    resident = int(spare // layer)  # 26 of 80 (24 with the draft's input embedding on the card)
    assert f"  layers         {resident} resident, {80 - resident} in RAM, 0 on disk" in out
    assert re.search(rf"^    {resident} resident decoder layers +{gb(resident * layer)}$", out, re.M)
    assert f"  per pass       {gb((80 - resident) * layer).removesuffix(' GB')} GB streamed;" in out


def resident_layers(out: str) -> int:
    return int(re.search(r"^  layers +(\d+) resident", out, re.M).group(1))


def test_doctor_plans_serves_slots_a_target_and_a_draft_kv_cache_each(monkeypatch, capsys):
    """`--slots 4` as `serve --slots 4` keeps them: four caches of each model, their room taken from
    the card's resident layers; `--slots auto` keeps one there, as serve would."""
    card = ["doctor", "--target", "llama-3.1-70b-awq", "--draft", "llama-3.1-8b-awq", "--vram-gb", "24", "--ram-gb",
            "64", "--pcie-gbps", "25"]
    outs = {slots: run_cli(monkeypatch, capsys, *card, "--slots", slots)[1] for slots in ("1", "4", "auto")}
    tokens = 4096 + 2049
    kept = f"4 conversations of {tokens} tokens"
    assert re.search(rf"^    target KV caches \({kept}\) +{gb(4 * 80 * 2 * 8 * 128 * 2 * tokens)}$", outs["4"], re.M)
    assert re.search(rf"^    draft KV caches \({kept}\) +{gb(4 * 32 * 2 * 8 * 128 * 2 * tokens)}$", outs["4"], re.M)
    assert resident_layers(outs["4"]) < resident_layers(outs["1"])
    assert outs["auto"] == outs["1"] and f"target KV cache ({tokens} tokens)" in outs["1"]
    code, _, err = run_cli(monkeypatch, capsys, *card, "--slots", "0")
    assert_one_line_error(code, err, "--slots must be between 1 and 256 (got 0)")


def test_a_4_bit_draft_is_planned_packed_on_a_cpu(monkeypatch, capsys):
    """An AWQ draft's stored weights are its smallest form: a CPU's auto does not plan it in int8
    (its linears are packed; planning int8 for them crashed)."""
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "llama-3.1-70b-awq", "--draft",
                           "llama-3.1-8b-awq", "--ram-gb", "64")
    assert code == 0
    assert "  context        4096 tokens, draft in none" in out and "draft weights (none)" in out


def test_quantizing_a_4_bit_draft_again_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--target", "llama-3.1-70b-awq", "--draft",
                           "llama-3.1-8b-awq", "--draft-quant", "int8")
    assert_one_line_error(code, err, "--draft-quant int8: llama-3.1-8b-awq stores 4-bit GPTQ or AWQ weights")


def test_expanding_a_draft_stored_in_full_weights_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--draft-quant", "dense")
    assert_one_line_error(code, err, "--draft-quant dense expands a draft stored in 4 bits (GPTQ or AWQ); "
                                     "qwen2.5-coder-0.5b stores full weights: use --draft-quant none")


def test_an_fp8_draft_without_fp8_units_is_one_line(monkeypatch, capsys):
    """A CPU has no fp8 matrix units: --draft-quant fp8 is refused before anything loads."""
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--draft-quant", "fp8")
    assert_one_line_error(code, err, "--draft-quant fp8 needs fp8 matrix units (CUDA compute capability 8.9 up: "
                                     "Ada, Hopper); cpu has none: use --draft-quant auto")
