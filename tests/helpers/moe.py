"""Tiny GPTQ and GGUF MoE targets as the MoE tests load them (in memory or streamed), their
drafts, and the checks they share: experts and routers as written, logits as in memory, and
SpecExec's tokens transformers' own reply on the dequantized weights."""

from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from helpers.exactness import MAX_TIES, NEAR_TIE
from helpers.gguf_moe_writer import write_moe_gguf
from helpers.gptq_moe_writer import EXPERTS, HIDDEN, PROJECTIONS
from helpers.planned import streamed_from
from helpers.reference_loop import assert_transformers_tokens
from helpers.tiny import perturbed_in_place
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.convert import convert
from specchat.models.convert_int4 import convert_int4
from specchat.offload.build import offload_model
from specchat.progress import Reporter
from specchat.quant.gptq import GPTQSpec
from specchat.quant.split_experts import SplitExperts

QUIET = Reporter(bars=False)
CPU = torch.device("cpu")
PROMPT = [3, 14, 15, 9, 26, 5, 40, 41, 77]
NEW_TOKENS = 24


SAMPLINGS = [SamplingParams(temperature=0.0, top_p=1.0, seed=0), SamplingParams(temperature=0.6, top_p=0.9, seed=11)]
# GPTQ groups of 32 (the kernel's) with act-order, and the Mixtral alias's: one group, act-order, symmetric
SPECS = {"g32-act-order-asym": GPTQSpec(group_size=32, desc_act=True, sym=False),
         "g-1-act-order-sym": GPTQSpec(group_size=-1, desc_act=True, sym=True)}


def loaded(directory: Path) -> PreTrainedModel:
    """The checkpoint in memory, as models.loading.load builds a GPTQ target."""
    model, _ = offload_model(directory, "tiny-moe", torch.float32, CPU, None, None, QUIET)
    return model


def logits(lm: CausalLM) -> torch.Tensor:
    prompt = torch.tensor(PROMPT)
    return lm.logits(lm.hidden(prompt, torch.arange(prompt.numel()), new_cache()))


def split_linears(layer: nn.Module) -> list[nn.Module]:
    """A decoder layer's experts' linears, expert by expert, once its experts are found split."""
    experts = layer.mlp.experts
    assert isinstance(experts, SplitExperts) and experts.num_experts == EXPERTS
    return [getattr(experts.get_submodule(str(e)), n) for e in range(EXPERTS) for n in PROJECTIONS]


def assert_routers_kept(model: PreTrainedModel, dense: PreTrainedModel) -> None:
    """Every router is dense float32, the checkpoint's as the `dense` model holds it, and nothing is
    left on meta."""
    for layer in model.model.layers:
        assert layer.mlp.gate.weight.dtype == torch.float32 and layer.mlp.gate.weight.shape == (EXPERTS, HIDDEN)
    assert not any(t.is_meta for t in model.state_dict().values())
    assert torch.equal(model.model.layers[1].mlp.gate.weight, dense.model.layers[1].mlp.gate.weight)


def routed(dense: PreTrainedModel, layer: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states [tokens, H] and the dense model's router's choice for them (top-k index, weights)."""
    hidden = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(seed), dtype=dense.dtype)
    _, weights, index = dense.model.layers[layer].mlp.gate(hidden)
    return hidden, index, weights


# Each float32 weight is the 4-bit one exactly (quant/int4_gptq.py); what differs is float32
# rounding (2**-24 a step) over dot products of at most 128 terms, twice over. Measured on the
# project's AMD EPYC, 2026-11-28, over the 6 GPTQ checkpoints of test_moe_gptq and test_moe_awq's 2
# AWQ ones, 2 layers each: 2.4e-7 to 5.7e-7 of the largest output. The bound is 2x the largest: an
# expert's output a few float32 steps off (x (1 + 2**-18) in SplitExperts.expert_output) fails it,
# and passed the earlier 1e-5.
EXPERTS_BOUND = 1.1e-6  # of the largest output


def assert_experts_equal(model: PreTrainedModel, dense: PreTrainedModel, layer: int) -> None:
    """`model`'s split int4 experts of `layer` give the float64 `dense` model's fused experts' outputs."""
    experts = model.model.layers[layer].mlp.experts
    hidden, index, weights = routed(dense, layer, 16, seed=layer)
    assert set(index.flatten().tolist()) == set(range(EXPERTS))  # every expert is checked
    reference = dense.model.layers[layer].mlp.experts(hidden, index, weights)
    out = experts(hidden.float(), index, weights.float()).double()
    torch.testing.assert_close(out, reference, atol=EXPERTS_BOUND * float(reference.abs().max()), rtol=0)


def assert_streams_the_in_memory_logits(directory: Path, tier: str, offload_dir: Path) -> None:
    """Every layer of the checkpoint streamed from `tier`, experts and router in its places, gives
    the in-memory model's logits bitwise."""
    with streamed_from(directory, "tiny-moe", tier, offload_dir) as (model, offload):
        assert offload.streamed == (0, 1)
        places = {place.name for place in offload.store.layouts[0].places}
        assert f"mlp.experts.{EXPERTS - 1}.down_proj.packed" in places and "mlp.gate.weight" in places
        assert torch.equal(logits(CausalLM(model, offload)), logits(CausalLM(loaded(directory))))


def draft_of(model: PreTrainedModel) -> CausalLM:
    """A draft that mostly agrees with the target: the dense model of its weights, perturbed."""
    return CausalLM(perturbed_in_place(model))


def assert_specexec_emits_transformers_tokens(target: CausalLM, draft: CausalLM, dense: PreTrainedModel,
                                              sampling: SamplingParams) -> None:
    """SpecExec over `target` with `draft` emits transformers' own reply (greedy `generate`, seeded
    tests/helpers/reference_loop.py) on `dense`, transformers' float32 model of the same weights read apart
    from specchat's loader (fused experts, its own routing): up to float32's near-ties
    (tests/helpers/exactness.py), as the same weights summed in another order differ; some drafted tokens
    accepted."""
    engine = TreeEngine(SPECEXEC, target, draft, [], TreeShape(budget=16, max_depth=6))
    events = list(engine.generate(PROMPT, NEW_TOKENS, sampling))
    tokens = [t for e in events for t in e.token_ids]
    assert_transformers_tokens(dense, PROMPT, tokens, NEW_TOKENS, sampling, (), NEAR_TIE, MAX_TIES)
    assert sum(e.accepted for e in events) > 0 and len(events) < NEW_TOKENS


class Converted:
    """A tiny MoE GGUF and its two conversions: float32 (`dense`) and 4-bit (`int4`)."""

    def __init__(self, root: Path, family: str, down: GGMLQuantizationType) -> None:
        self.family, self.down = family, down
        self.gguf = write_moe_gguf(root / f"{family}.gguf", family, down)
        self.dense, self.int4 = root / "dense", root / "int4"
        convert(self.gguf, self.dense, "0" * 64, QUIET)
        convert_int4(self.gguf, self.dense, self.int4, QUIET)

    def loaded(self, compact_layers: bool = False) -> PreTrainedModel:
        """The 4-bit conversion in memory, as models.loading.load builds it."""
        model, _ = offload_model(self.int4, "tiny-moe-gguf", torch.float32, CPU, None, None, QUIET,
                                 compact_layers=compact_layers)
        return model

    def dense_model(self) -> PreTrainedModel:
        """transformers' own model of the dense conversion (fused experts)."""
        return AutoModelForCausalLM.from_pretrained(self.dense, dtype=torch.float32).eval().requires_grad_(False)
