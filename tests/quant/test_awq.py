"""AWQ checkpoints (AutoAWQ's GEMM format) through the packed int4 path: the nibble order is
AutoAWQ's, the converted weight is an independent dequantization's bitwise, a loaded model (in
memory and streamed) gives the dequantized model's logits, SpecExec over it emits transformers'
greedy tokens on the dequantized model (its draft packed or expanded), other AWQ variants are one
line, and the 70B AWQ pair plans offline, its draft packed or expanded by the iteration each
predicts."""

import inspect
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers.awq_writer import AWQDraw, dequantized_model, pack_awq, write_awq_checkpoint
from helpers.cli import CORPUS, assert_one_line_error, run_cli, train_tokenizer
from helpers.exactness import MAX_TIES, NEAR_TIE
from helpers.plan_sizes import BF16, ROTARY_BYTES, assert_fits, gpu_plan, int4_linear, item, llama_layer_linears
from helpers.planned import offload_planned
from helpers.reference_loop import assert_transformers_tokens
from helpers.tiny import tiny_qwen_config
from torch import nn
from transformers import AutoConfig, AwqConfig, Qwen2ForCausalLM

from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.errors import SpecchatError
from specchat.checkpoint import skeleton
from specchat.checkpoint.skeleton import fill
from specchat.checkpoint.sources import SafetensorsSource
from specchat.models.draft import DraftQuant, load_draft
from specchat.models.loading import load
from specchat.offload.host_embedding import HostEmbedding, host_lookup
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant.awq import (AWQSpec, awq_to_int4, kernel_group_size, read_awq_spec, replace_linears_with_awq,
                                unpack_awq)
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_pack import PACK_ROWS
from specchat.quant.widths import UNLIMITED, WidthChoice

QUIET = Reporter(bars=False)
CPU = torch.device("cpu")
PROMPT = [3, 14, 15, 9, 26, 5]
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, seed=0)
NEW_TOKENS = 24
GB = 10**9


def test_the_nibble_order_is_autoawqs():
    # output columns 0..7 of one word: nibble k holds column AWQ_ORDER[k] = 0, 2, 4, 6, 1, 3, 5, 7
    word = torch.tensor([[0x75316420]], dtype=torch.int32)
    assert unpack_awq(word).tolist() == [list(range(8))]
    assert torch.equal(pack_awq(torch.arange(8).view(1, 8)), word)


def random_draw(inputs: int, outputs: int, group_size: int, seed: int) -> AWQDraw:
    generator = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else inputs // group_size
    scales = (torch.rand(groups, outputs, generator=generator) * 0.02 + 1e-4).to(torch.float16)
    return AWQDraw(torch.randint(0, 16, (inputs, outputs), generator=generator),
                   torch.randint(0, 16, (groups, outputs), generator=generator), scales)


# outputs past PACK_ROWS convert in chunks of it (its last one partial)
@pytest.mark.parametrize("outputs", [96, PACK_ROWS + 96])
@pytest.mark.parametrize("group_size", [128, 64, 32, -1, 512])
def test_the_converted_weight_is_an_independent_dequantization_bitwise(group_size, outputs):
    draw = random_draw(1024, outputs, group_size, seed=group_size % 97)
    kernel_group = kernel_group_size(AWQSpec(group_size), 1024)
    weight = awq_to_int4(pack_awq(draw.q), pack_awq(draw.zeros), draw.scales, kernel_group)
    assert weight.perm is None and kernel_group == min(256, 1024 if group_size == -1 else group_size)
    assert torch.equal(weight.dequantize(), draw.dequantize().float())  # float64's value is float32's exactly


def tiny_model(seed: int) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 whose every linear fits the int4 kernels (outputs in multiples of 64), its
    LM head sharpened so that a draft's tokens are accepted."""
    torch.manual_seed(seed)
    config = tiny_qwen_config(vocab_size=96, hidden_size=128, intermediate_size=256, max_position_embeddings=256,
                              tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model


@pytest.fixture(scope="module")
def awq(tmp_path_factory) -> tuple[Path, nn.Module]:
    """The AWQ directory (groups of 64) and the float32 model of its dequantized weights."""
    model = tiny_model(7)
    directory = tmp_path_factory.mktemp("awq")
    return directory, dequantized_model(model, write_awq_checkpoint(model, directory, group_size=64))



@pytest.mark.parametrize("kernel", [None, torch.device("cpu"), torch.device("cuda")], ids=["unnamed", "cpu", "cuda"])
def test_an_awq_skeletons_linears_are_laid_out_for_the_kernel_named_or_the_cpus(awq, kernel):
    directory, _ = awq
    model = skeleton.build_skeleton(AutoConfig.from_pretrained(directory), SafetensorsSource(directory),
                                    torch.bfloat16, kernel=kernel)
    kernels = {m.kernel for m in model.modules() if isinstance(m, Int4Linear)}
    assert kernels == {"cpu" if kernel is None else kernel.type}

@pytest.fixture(scope="module")
def awq_draft(tmp_path_factory) -> tuple[Path, nn.Module]:
    """A draft that mostly agrees with the target: its weights perturbed, in AWQ groups of 128; the
    directory and the float32 model of its dequantized weights."""
    model = tiny_model(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter) * parameter.std())
    directory = tmp_path_factory.mktemp("awq-draft")
    return directory, dequantized_model(model, write_awq_checkpoint(model, directory, group_size=128))


def logits(lm: CausalLM) -> torch.Tensor:
    prompt = torch.tensor(PROMPT)
    return lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), new_cache()))


@pytest.mark.parametrize("fused_rows", [UNLIMITED, 0], ids=["fused", "chunked"])
def test_an_awq_directory_loads_packed_with_the_dequantized_models_logits(awq, fused_rows):
    directory, reference = awq
    model = load(str(directory), torch.float32, progress=False).model
    linears = [module for module in model.modules() if isinstance(module, Int4Linear)]
    assert len(linears) == 2 * 7 and not any(type(m) is nn.Linear for m in model.model.layers.modules())
    assert not any(t.is_meta for t in model.state_dict().values())
    for linear in linears:
        linear.widths = WidthChoice(fused_rows, torch.float32)
    # the same weights, summed in another order: float32 rounding only
    torch.testing.assert_close(logits(CausalLM(model)), logits(CausalLM(reference)), atol=2e-5, rtol=0)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_an_awq_model_streams_packed_layers_with_the_dequantized_models_logits(awq, tmp_path, tier):
    directory, reference = awq
    plan = PlanRequest(tier=tier, offload_dir=tmp_path, resident_layers=0, slots=2)
    model, offload = offload_planned(directory, "tiny-awq", torch.float32, CPU, plan, QUIET)
    try:
        places = {place.name: place for place in offload.store.layouts[0].places}
        assert places["self_attn.q_proj.packed"].dtype == torch.uint8 and "self_attn.q_proj.qweight" not in places
        torch.testing.assert_close(logits(CausalLM(model, offload)), logits(CausalLM(reference)), atol=2e-5, rtol=0)
    finally:
        offload.close()


@pytest.mark.parametrize("tier", [None, "ram", "disk"], ids=["in-memory", "ram", "disk"])
def test_greedy_specexec_over_an_awq_target_and_draft_emits_transformers_tokens_for_its_weights(awq, awq_draft,
                                                                                              tmp_path, tier):
    directory, reference = awq
    loaded = load(str(directory), torch.float32, progress=False)
    target = CausalLM(loaded.model)
    # the 4-bit draft as the CPU's default prepares it: its linears stay packed, its embedding and head in int8
    draft = load_draft(str(awq_draft[0]), CPU, torch.float32, None, loaded.tokenizer, QUIET, DraftQuant("int8"), None)
    assert sum(isinstance(m, Int4Linear) for m in draft.model.modules()) == 2 * 7
    offload = None
    if tier is not None:
        plan = PlanRequest(tier=tier, offload_dir=tmp_path, resident_layers=0, slots=2)
        model, offload = offload_planned(directory, "tiny-awq", torch.float32, CPU, plan, QUIET)
        target = CausalLM(model, offload)
    try:
        events = list(TreeEngine(SPECEXEC, target, draft, [], TreeShape(budget=16, max_depth=6)).generate(
            PROMPT, NEW_TOKENS, GREEDY))
    finally:
        if offload is not None:
            offload.close()
    tokens = [t for e in events for t in e.token_ids]
    # transformers' greedy `generate` on the writer's own dequantization of the draws, up to float32's near-ties
    assert_transformers_tokens(reference, PROMPT, tokens, NEW_TOKENS, GREEDY, (), NEAR_TIE, MAX_TIES)
    assert sum(e.accepted for e in events) > 0 and len(events) < NEW_TOKENS


def test_an_awq_draft_loaded_dense_multiplies_its_weights_and_specexec_emits_transformers_tokens(awq, awq_draft):
    """--draft-quant dense: the draft's 4-bit linears expanded as its layers load, each to the
    checkpoint's dequantized weight exactly."""
    directory, reference = awq
    draft_directory, draft_weights = awq_draft
    loaded = load(str(directory), torch.float32, progress=False)
    drafts = {kind: load_draft(str(draft_directory), CPU, torch.float32, None, loaded.tokenizer, QUIET,
                               DraftQuant(kind), None) for kind in ("none", "dense")}
    assert sum(isinstance(m, Int4Linear) for m in drafts["none"].model.modules()) == 2 * 7
    assert not any(isinstance(m, Int4Linear) for m in drafts["dense"].model.modules())
    expanded = {name: module for name, module in drafts["dense"].model.named_modules()
                if type(module) is nn.Linear and ".layers." in name}
    assert len(expanded) == 2 * 7
    for name, linear in expanded.items():  # (q - z) * s rounds to float32 once, in the writer and in the expansion
        assert torch.equal(linear.weight, draft_weights.get_submodule(name).weight), name
    # the same weights summed in another order, float32 rounding only, logits up to ~5.3: at most 3.8e-6
    # apart on the AMX Xeon (2026-12-05; 1.8e-6 on the AMD EPYC, 2026-11-29)
    torch.testing.assert_close(logits(drafts["dense"]), logits(drafts["none"]), atol=7.6e-6, rtol=0)
    events = list(TreeEngine(SPECEXEC, CausalLM(loaded.model), drafts["dense"], [],
                             TreeShape(budget=16, max_depth=6)).generate(PROMPT, NEW_TOKENS, GREEDY))
    tokens = [t for e in events for t in e.token_ids]
    assert_transformers_tokens(reference, PROMPT, tokens, NEW_TOKENS, GREEDY, (), NEAR_TIE, MAX_TIES)
    assert sum(e.accepted for e in events) > 0


@pytest.mark.parametrize("kind", ["none", "dense"])
def test_an_awq_draft_with_its_input_embedding_on_the_host_scores_as_it_does_on_the_device(awq, awq_draft, kind):
    """Beside a GPU the plan holds an untied draft's input embedding in host RAM (one row a token is
    all a step reads): it is read from the checkpoint's float16 file into host RAM in the draft's
    dtype, never onto the device, and the draft scores what it scores with the embedding on the device."""
    directory, _ = awq
    tokenizer = load(str(directory), torch.float32, progress=False).tokenizer
    placed: list[set[str]] = []  # what each load put on its device, outside the layers (here the CPU stands for it)

    def filled(module, tensors, device):
        if "lm_head.weight" in tensors:  # the parts outside the layers
            placed.append(set(tensors))
        fill(module, tensors, device)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(skeleton, "fill", filled)
        plain, hosted = (load_draft(str(awq_draft[0]), CPU, torch.float32, None, tokenizer, QUIET,
                                    DraftQuant(kind, host_embedding=on), None) for on in (False, True))
    assert ["model.embed_tokens.weight" in names for names in placed] == [True, False]
    table = host_lookup(hosted.model)
    assert isinstance(hosted.model.get_input_embeddings(), HostEmbedding) and host_lookup(plain.model) is None
    assert table.weight.dtype == torch.float32 and table.weight.device == CPU
    assert torch.equal(logits(hosted), logits(plain))


def test_the_cli_runs_an_awq_pair_with_its_draft_expanded(tmp_path, monkeypatch, capsys):
    """`generate --draft-quant dense` through the plan and the loader: the plan says dense."""
    tokenizer = train_tokenizer(CORPUS)
    for name, seed in (("target", 0), ("draft", 1)):
        torch.manual_seed(seed)
        config = tiny_qwen_config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                                  max_position_embeddings=256, tie_word_embeddings=False,
                                  eos_token_id=tokenizer.eos_token_id)
        write_awq_checkpoint(Qwen2ForCausalLM(config).eval(), tmp_path / name, group_size=64)
        tokenizer.save_pretrained(tmp_path / name)
    code, out, err = run_cli(monkeypatch, capsys, "generate", "hello there", "--target", str(tmp_path / "target"),
                             "--draft", str(tmp_path / "draft"), "--draft-quant", "dense", "--max-new-tokens", "8",
                             "--temperature", "0", "--json", "--dtype", "float32", "--offload-dir", str(tmp_path / "off"))
    assert code == 0, err
    record = json.loads(out)
    assert record["plan"]["draft_quant"] == "dense" and record["summary"]["new_tokens"] == 8


BAD_VARIANTS = [
    ({"version": "gemv"}, "AWQ version 'gemv' is not supported"),
    ({"version": "marlin"}, "AWQ version 'marlin' is not supported"),
    ({"version": "exllama"}, "AWQ version 'exllama' is not supported"),
    ({"bits": 8}, "8-bit AWQ is not supported"),
    ({"zero_point": False}, "AWQ without zero points (zero_point false) is not supported"),
    ({"backend": "llm-awq"}, "AWQ checkpoints of the 'llm-awq' backend are not supported"),
]


def test_settings_left_out_or_null_are_autoawqs_defaults():
    """A config naming only the method (or nulls) reads as AutoAWQ's GEMM checkpoints in groups
    of 128, as transformers' AwqConfig defaults them; a group of -1 spans the inputs, 0 is refused."""
    defaults = inspect.signature(AwqConfig).parameters
    assert (defaults["bits"].default, defaults["group_size"].default, defaults["zero_point"].default) == (4, 128, True)
    assert read_awq_spec({"quantization_config": {"quant_method": "awq"}}) == AWQSpec(128)
    nulls = dict.fromkeys(("bits", "group_size", "zero_point", "version", "backend"))
    assert read_awq_spec({"quantization_config": {"quant_method": "AWQ", **nulls}}) == AWQSpec(128)
    assert read_awq_spec({"quantization_config": {"quant_method": "awq", "group_size": -1}}) == AWQSpec(-1)
    with pytest.raises(SpecchatError, match="AWQ group_size 0 is invalid"):
        read_awq_spec({"quantization_config": {"quant_method": "awq", "group_size": 0}})


def bad_variant(awq, directory: Path, settings: dict) -> Path:
    """The AWQ directory's weights under a config.json declaring another variant."""
    source, _ = awq
    shutil.copy(source / "model.safetensors", directory / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] |= settings
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(("settings", "message"), BAD_VARIANTS, ids=[m.split(" is")[0] for _, m in BAD_VARIANTS])
def test_other_awq_variants_are_refused_in_one_line(awq, tmp_path, settings, message):
    with pytest.raises(SpecchatError, match=re.escape(message)) as refused:
        load(str(bad_variant(awq, tmp_path, settings)), torch.float32, progress=False)
    assert "\n" not in str(refused.value)


def test_a_layer_the_int4_kernels_cannot_take_is_refused_not_expanded_per_call(tmp_path):
    write_awq_checkpoint(tiny_model(3), tmp_path, group_size=16)  # no kernel group of 16 inputs
    with pytest.raises(SpecchatError, match=r"AWQ layer 'model\.layers\.\d\.\S+' \(\d+ x \d+, groups of 16\) "
                                            r"does not fit cpu's int4 kernels"):
        load(str(tmp_path), torch.float32, progress=False)


def test_a_width_the_kernels_cannot_take_is_refused_though_its_groups_fit():
    """Groups of 128 the kernels take, but 40 outputs (not a multiple of 16); 64 outputs fit."""
    model = nn.ModuleDict({"narrow": nn.Linear(128, 40), "wide": nn.Linear(128, 64)})
    with pytest.raises(SpecchatError, match=r"AWQ layer 'narrow' \(40 x 128, groups of 128\) does not fit"):
        replace_linears_with_awq(model, ["narrow"], AWQSpec(128), torch.float32, CPU)
    replace_linears_with_awq(model, ["wide"], AWQSpec(128), torch.float32, CPU)
    assert isinstance(model["wide"], Int4Linear) and model["wide"].group_size == 128


@pytest.mark.parametrize(("groups", "kernel_group"), [(3, 32), (8, 256)], ids=["uneven groups", "kernel group wider"])
def test_a_modules_groups_the_layers_kernel_group_does_not_divide_are_refused(groups, kernel_group):
    """1024 inputs in 3 groups, or in groups of 128 for a layer built with kernel groups of 256."""
    draw = random_draw(1024, 64, 1024 // groups, seed=0)
    with pytest.raises(SpecchatError, match=f"{groups} groups over 1024 inputs are not multiples of the int4 kernel"):
        awq_to_int4(pack_awq(draw.q), pack_awq(draw.zeros[:groups]), draw.scales[:groups], kernel_group)


def test_the_cli_refuses_an_awq_variant_in_one_line(awq, tmp_path, monkeypatch, capsys):
    directory = bad_variant(awq, tmp_path, {"version": "gemv"})
    code, _, err = run_cli(monkeypatch, capsys, "doctor", "--target", str(directory), "--draft", str(directory),
                           "--ram-gb", "64")
    assert_one_line_error(code, err, "AWQ version 'gemv' is not supported; only 'gemm' (AutoAWQ's default) is")


def test_the_70b_awq_pair_on_a_24_gb_card_plans_as_4_bit_layers_and_a_4_bit_draft():
    memory = gpu_plan("llama-3.1-70b-awq", "llama-3.1-8b-awq", 24, 64)
    # AWQ's groups of 128, no act-order: nibbles, a bf16 scale and zero per group and output; two norms
    layer = sum(int4_linear(i, o, 128, False) for i, o in llama_layer_linears(8192, 28672, 8)) + 2 * 8192 * BF16
    assert memory.placement.layers == (layer,) * 80 and 0.45 * GB < layer < 0.46 * GB
    # the draft's linears stay 4-bit (models/draft.py loads a packed checkpoint packed): its head and norms
    # in bf16 beside them, its input embedding on the host
    draft = 128256 * 4096 * BF16 + (2 * 32 + 1) * 4096 * BF16 + ROTARY_BYTES + \
        32 * sum(int4_linear(i, o, 128, False) for i, o in llama_layer_linears(4096, 14336, 8))
    assert memory.draft.quant == "none" and item(memory, "draft weights (") == draft
    assert item(memory, "the draft's input embedding, looked up on the host") == 128256 * 4096 * BF16
    assert_fits(memory, 24, 64)


def test_doctor_plans_the_70b_awq_pair_offline(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, _ = run_cli(monkeypatch, capsys, "doctor", "--target", "llama-3.1-70b-awq", "--draft", "llama-3.1-8b-awq",
                           "--vram-gb", "24", "--ram-gb", "64", "--pcie-gbps", "25")
    assert code == 0
    layer = sum(int4_linear(i, o, 128, False) for i, o in llama_layer_linears(8192, 28672, 8)) + 2 * 8192 * BF16
    resident = re.search(r"^    (\d+) resident decoder layers +([\d.]+) GB$", out, re.M)
    assert resident and abs(float(resident.group(2)) * GB / int(resident.group(1)) - layer) < 0.005 * GB
    assert re.search(rf"^  ring           \d+ slots of {layer / GB:.2f} GB$", out, re.M)
