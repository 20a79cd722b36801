"""Greedy and seeded SpecExec over a bfloat16 GPTQ target whose tree passes run the wide int4
path, against the target's autoregressive decoding, whose one-token passes run torch's fused
kernel. On CUDA the wide path is the Triton expansion and a cuBLAS matmul, forced here from
EXPAND_FROM rows (the crossover measured at a 70B model's shapes is 256 rows; at this model's
it may never be): the two products round differently, so a tree row's logits are not the
one-token pass's bits, and the tokens are judged by the bfloat16 near-tie rule (docs/exactness.md: what exact
means in bfloat16). The verdict says how many products expanded and every tie with its gap: this
is how the GPU finds out what the expansion does to exactness. A CPU never expands (Triton runs
there only under its interpreter: this check would take many minutes), so on a CPU the same code
runs every pass through the fused kernel, pinned to it (its in-memory GPTQ model keeps no dense
copies), and the verdict is named for that. SpecExec's tokens are also judged, by the same rule,
against transformers' own reply (greedy `generate`, seeded tests/helpers/reference_loop.py) on its float32
Llama holding the checkpoint's weights as AutoGPTQ dequantizes them: the autoregressive engine
shares the sampling and the int4 linears under test, transformers shares neither. The random
model's LM head is sharpened (SHARPNESS): with a random head's flat distributions, a bf16 target
against a float32 reference flipped 7 seeded draws in 32 tokens, each at a gap under 0.001."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from gpu_checks.tiny_models import random_model
from gpu_checks.verdict import Verdict, judged
from helpers.exactness import ExactnessCheck
from helpers.gptq_writer import dequantized_tensors, write_gptq_checkpoint
from helpers.reference_loop import assert_transformers_tokens
from helpers.tiny import perturbed_in_place
from safetensors.torch import load_file
from transformers import LlamaConfig, PreTrainedModel

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.offload.build import offload_model
from specchat.progress import Reporter
from specchat.quant import widths
from specchat.quant.gptq import GPTQSpec
from specchat.quant.int4 import use_fused_only

CHECK = "bf16 GPTQ SpecExec, wide passes expanded: tokens == autoregressive == transformers"
CPU_CHECK = "bf16 GPTQ SpecExec, every pass through the fused kernel: tokens == autoregressive == transformers"
DTYPE = torch.bfloat16
SPEC = GPTQSpec(group_size=32, desc_act=True, sym=False)  # CUDA's fused kernel takes groups of 32-256
EXPAND_FROM = 2  # rows: every tree pass expands, every one-token pass runs the fused kernel
PROMPT = [3, 14, 15, 9, 26, 5, 40, 41, 77]
NEW_TOKENS = 32
SAMPLINGS = {"greedy": SamplingParams(0.0, 1.0, 0), "seeded": SamplingParams(0.6, 0.9, 11)}
# docs/exactness.md's bfloat16 rule (tests/real/test_real_defaults.py): a difference passes where the engine's
# token is within 0.125 logits of the top (greedy) or of its draw's slot (seeded); ties a reply as
# where the CPU's tree passes take another product (its dense copies)
NEAR_TIE = 0.125
MAX_TIES = {"greedy": 2, "seeded": 4}
QUIET = Reporter(bars=False)
SHARPNESS = 8  # the LM head's scale (tests/helpers/gptq_moe_writer.py's too)


def small_llama() -> LlamaConfig:
    # widths the CUDA fused kernel and the expansion's layout take (multiples of 256 inputs)
    return LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=False)


def sharp_model(config: LlamaConfig) -> PreTrainedModel:
    """The random Llama with its LM head scaled by SHARPNESS: peaked next-token distributions, as a
    trained model's, where a random head's are so flat that bf16 rounding flips seeded draws at will."""
    model = random_model(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(SHARPNESS)
    return model


def draft_of(config: LlamaConfig, device: torch.device) -> CausalLM:
    """The target's own float weights, perturbed: a draft that mostly agrees with it."""
    return CausalLM(perturbed_in_place(sharp_model(config)).to(device, DTYPE))


@contextmanager
def expanding_from(rows: int) -> Iterator[list[int]]:
    """Int4Linears expand from `rows` rows (CUDA; a CPU never expands outside Triton's interpreter);
    yields the row counts of the products that expanded."""
    measured, product = widths.expand_rows, widths.expanded_linear
    expanded: list[int] = []

    def counted(x: torch.Tensor, *rest) -> torch.Tensor:
        expanded.append(x.shape[0])
        return product(x, *rest)

    widths.expand_rows, widths.expanded_linear = (lambda *shape: rows), counted
    try:
        yield expanded
    finally:
        widths.expand_rows, widths.expanded_linear = measured, product


def transformers_model(config: LlamaConfig, directory: Path, device: torch.device) -> PreTrainedModel:
    """transformers' float32 Llama of the checkpoint's weights, each GPTQ linear as AutoGPTQ
    dequantizes it (read apart from specchat's loader)."""
    model = sharp_model(config)
    state = dequantized_tensors(load_file(directory / "model.safetensors"))
    model.load_state_dict({name: tensor.float() for name, tensor in state.items()})
    return model.to(device).requires_grad_(False)


def against_transformers(reference: PreTrainedModel, tokens: list[int], name: str) -> tuple[bool, str]:
    """SpecExec's `tokens` against transformers' own reply on `reference` by the bf16 rule: (passed, what was found)."""
    try:
        ties = assert_transformers_tokens(reference, PROMPT, tokens, NEW_TOKENS, SAMPLINGS[name], (), NEAR_TIE,
                                          MAX_TIES[name])
    except AssertionError as failed:  # a verdict of FAIL, with what differed
        return False, f"against transformers: FAIL ({failed})"
    return True, f"against transformers: ties {ties}"


def compare(target: CausalLM, draft: CausalLM, reference: PreTrainedModel, name: str) -> tuple[bool, str, float]:
    """SpecExec's tokens against the target's autoregressive ones and against transformers' reply:
    (both passed, what was found, the gen rate)."""
    sampling = SAMPLINGS[name]
    autoregressive = [t for e in AutoregressiveEngine(target, []).generate(PROMPT, NEW_TOKENS, sampling)
                      for t in e.token_ids]
    events = list(TreeEngine(SPECEXEC, target, draft, [], TreeShape(budget=64, max_depth=8)).generate(PROMPT, NEW_TOKENS,
                                                                                          sampling))
    tokens = [t for e in events for t in e.token_ids]
    judge = ExactnessCheck(target, frozenset(), NEW_TOKENS, near_tie=NEAR_TIE, max_ties=MAX_TIES[name])
    comparison = judge.compare(PROMPT, autoregressive, tokens, sampling)
    passed, found = against_transformers(reference, tokens, name)
    return comparison.acceptable and passed, f"{comparison.describe()}; {found}", len(tokens) / len(events)


def check_expanded_specexec(device: torch.device, workdir: Path) -> Verdict:
    config = small_llama()
    directory = workdir / "small-llama-gptq-g32-sharp"
    if not (directory / "config.json").exists():
        write_gptq_checkpoint(sharp_model(config), directory, SPEC)
    model, _ = offload_model(directory, directory.name, DTYPE, device, None, None, QUIET)
    cuda = device.type == "cuda"
    if not cuda:
        use_fused_only(model)  # whatever product this CPU's probe would pick for wide inputs
    target, draft = CausalLM(model), draft_of(config, device)
    reference = transformers_model(config, directory, device)
    with expanding_from(EXPAND_FROM) as expanded:
        results = {name: compare(target, draft, reference, name) for name in SAMPLINGS}
    wide = f"{len(expanded)} products expanded" if cuda else "the fused kernel at every width (CPU)"
    ok = all(passed for passed, _, _ in results.values()) and (not cuda or expanded)
    return judged(f"{CHECK if cuda else CPU_CHECK} ({device.type})", ok, f"{wide}; " + "; ".join(
        f"{name}: gen rate {rate:.2f}, {found}" for name, (_, found, rate) in results.items()))
