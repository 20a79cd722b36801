"""split_experts: a MoE block's experts as three linears each, fed by an ExpertFeed. What the
split experts compute is checked against transformers' fused experts in test_moe_gptq (bitwise on
dense linears, on 4-bit weights loaded from GPTQ checkpoints) and test_moe_gguf (a GGUF's); here,
the order in which a forward asks its feed for experts, and which modules a checkpoint's names
split."""

import pytest
import torch
from torch import nn
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralExperts

from specchat.quant.int4_checkpoint import INT4_SUFFIXES
from specchat.quant.q6k import Q6_SUFFIXES
from specchat.quant.q6k_linear import Q6Linear
from specchat.quant.split_experts import SplitExperts, split_stored_experts

HIDDEN, INTERMEDIATE, EXPERTS = 8, 16, 4


class RecordingFeed:
    """An ExpertFeed that records what it is asked, in order."""

    def __init__(self, calls: list[tuple]) -> None:
        self.calls = calls

    def start(self, experts: list[int]) -> None:
        self.calls.append(("start", experts))

    def wait(self, expert: int) -> None:
        self.calls.append(("wait", expert))

    def settle(self) -> None:
        self.calls.append(("settle",))


def fed_experts(calls: list[tuple]) -> SplitExperts:
    """Experts with seeded weights, each gate_proj recording its run in `calls`."""
    experts = SplitExperts(EXPERTS, HIDDEN, INTERMEDIATE, nn.SiLU())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in experts.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    for expert in range(EXPERTS):
        experts.get_submodule(f"{expert}.gate_proj").register_forward_pre_hook(
            lambda module, args, expert=expert: calls.append(("run", expert)))
    experts.feed = RecordingFeed(calls)
    return experts


def routed(experts: SplitExperts) -> torch.Tensor:
    index = torch.tensor([[3, 0], [0, 3], [1, 3]])  # three tokens, routed to experts 0, 1 and 3
    return experts(torch.randn(3, HIDDEN), index, torch.full((3, 2), 0.5))


def test_a_forward_starts_the_routed_experts_at_once_waits_for_each_before_it_runs_then_settles():
    calls: list[tuple] = []
    routed(fed_experts(calls))
    assert calls == [("start", [0, 1, 3]), ("wait", 0), ("run", 0), ("wait", 1), ("run", 1), ("wait", 3), ("run", 3),
                     ("settle",)]


def test_a_forward_that_raises_still_settles_its_loads():
    """Nothing may write into the experts' weights once the forward is gone, raised or not."""
    calls: list[tuple] = []
    experts = fed_experts(calls)

    def fail(module, args):
        raise RuntimeError("expert 1 failed")

    experts.get_submodule("1.up_proj").register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="expert 1 failed"):
        routed(experts)
    assert calls[-2:] == [("run", 1), ("settle",)]


def test_names_given_once_through_split_each_block_they_lie_under_as_stored():
    """The checkpoint's names may come as any iterable, read once: a block under Int4Weight names is
    split, one under a Q6Weight's also, its linear an empty Q6Linear; a block under neither is not."""
    config = MixtralConfig(hidden_size=64, intermediate_size=128, num_local_experts=EXPERTS)
    model = nn.Module()
    for block in ("int4", "q6", "dense"):
        model.add_module(block, MixtralExperts(config))
    names = [f"int4.0.gate_proj{INT4_SUFFIXES[0]}", f"int4.0.gate_proj{INT4_SUFFIXES[1]}",
             f"q6.2.down_proj{Q6_SUFFIXES[0]}", "dense.gate_up_proj"]
    split_stored_experts(model, iter(names), torch.bfloat16)
    assert isinstance(model.int4, SplitExperts) and isinstance(model.q6, SplitExperts)
    assert type(model.dense) is MixtralExperts
    q6 = model.q6.get_submodule("2.down_proj")
    assert type(q6) is Q6Linear and (q6.in_features, q6.out_features) == (128, 64)
    assert type(model.q6.get_submodule("1.down_proj")) is nn.Linear  # an expert the names hold no Q6Weight of
