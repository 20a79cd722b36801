"""A MoE block's experts as three linears per expert, the way GPTQ checkpoints (AutoGPTQ,
GPTQModel) store them, in place of transformers' fused 3-D expert parameters.

transformers 5 holds the E experts of a Mixtral, Qwen2-MoE or Qwen3-MoE block fused:
gate_up_proj [E, 2I, H] (expert e's gate rows, then its up rows) and down_proj [E, H, I]. For a token t routed to experts
e_1..e_k with routing weights w_1..w_k its output is

    y_t = sum_j w_j * down_{e_j}(act(gate_{e_j}(x_t)) * up_{e_j}(x_t)),

summed by index_add in ascending expert order. `SplitExperts` computes it the same way, in the
same order, with expert e's gate_proj, up_proj and down_proj as modules of their own: nn.Linear
placeholders in a skeleton, then GPTQLinears, then Int4Linears (quant/int4_gptq.py), so that an
expert some token routes to costs one 4-bit product per linear and no expert is ever expanded
beyond what its own linear does.
"""

from collections.abc import Iterable
from typing import Protocol

import torch
from torch import Tensor, nn
from transformers.initialization import no_init_weights

from specchat.errors import SpecchatError
from specchat.quant.int4_checkpoint import int4_modules
from specchat.quant.q6k import q6_modules
from specchat.quant.q6k_linear import Q6Linear

# transformers' flags (integrations/moe.py) of the one fused layout this module reproduces.
FUSED_LAYOUT = {"is_concatenated": True, "is_transposed": False, "has_bias": False, "has_gate": True}


class ExpertFeed(Protocol):
    """Puts experts' weights in place before their products run: a layer streamed by expert
    (offload/experts.py) loads only the experts its router picked."""

    def start(self, experts: list[int]) -> None:
        """Begin bringing in `experts` (ascending), all at once, so that the later ones load while
        the first ones compute."""

    def wait(self, expert: int) -> None:
        """Block until `expert`'s weights are in place (one of those started)."""

    def settle(self) -> None:
        """Wait out every load started: nothing writes into the weights once the forward has
        returned or raised."""


class Resident:
    """The feed of experts that are always in place."""

    def start(self, experts: list[int]) -> None:
        pass

    def wait(self, expert: int) -> None:
        pass

    def settle(self) -> None:
        pass


class ExpertLinears(nn.Module):
    """One expert's three linears, named as Qwen3-MoE's GPTQ checkpoints name them."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)


class SplitExperts(nn.Module):
    """Stands where transformers' fused experts module stood, with its forward's signature and
    math; expert e is the submodule named "e" (so its linears are `experts.e.gate_proj`, ...)."""

    def __init__(self, count: int, hidden: int, intermediate: int, act_fn: nn.Module) -> None:
        super().__init__()
        self.num_experts = count
        self.act_fn = act_fn
        self.feed: ExpertFeed = Resident()
        with no_init_weights():  # empty: filled from the checkpoint (a 235B's 36096 linears drew 4 s of init)
            for index in range(count):
                self.add_module(str(index), ExpertLinears(hidden, intermediate))

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        """hidden_states [T, H], top_k_index and top_k_weights [T, k] -> [T, H]."""
        out = torch.zeros_like(hidden_states)
        by_slot = top_k_index.t()  # [k, T]: an expert's rows ordered by slot, then token, as transformers orders them
        experts = torch.unique(top_k_index).tolist()  # ascending: each token's terms summed in transformers' order
        self.feed.start(experts)
        try:
            for expert in experts:
                slot, token = torch.where(by_slot == expert)
                self.feed.wait(expert)
                out.index_add_(0, token, self.expert_output(expert, hidden_states[token], top_k_weights[token, slot, None]))
        finally:
            self.feed.settle()
        return out

    def expert_output(self, expert: int, rows: Tensor, weights: Tensor) -> Tensor:
        """w * down(act(gate(x)) * up(x)) for the rows routed to `expert`, in the rows' dtype (the
        product with float32 routing weights is taken in float32 first, as transformers takes it)."""
        linears = self.get_submodule(str(expert))
        hidden = self.act_fn(linears.gate_proj(rows)) * linears.up_proj(rows)
        return (linears.down_proj(hidden) * weights).to(rows.dtype)


def is_fused_experts(module: nn.Module) -> bool:
    """Whether `module` holds its experts as transformers' fused 3-D gate_up_proj and down_proj."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter) and gate_up.dim() == down.dim() == 3


def split_experts(model: nn.Module, packed: Iterable[str] | None) -> None:
    """Replace each fused experts module that the checkpoint's `packed` linears (module names) lie
    under by an empty SplitExperts on its device (None: every one, as AutoGPTQ quantizes every
    expert). One line for a fused layout other than FUSED_LAYOUT."""
    held = None if packed is None else list(packed)
    for name, module in list(model.named_modules()):
        if not is_fused_experts(module) or (held is not None and not any(n.startswith(name + ".") for n in held)):
            continue
        check_layout(name, module)
        count, double, hidden = module.gate_up_proj.shape
        with torch.device(module.gate_up_proj.device):
            model.set_submodule(name, SplitExperts(count, hidden, double // 2, module.act_fn))


def split_stored_experts(model: nn.Module, names: Iterable[str], dtype: torch.dtype) -> None:
    """Split each fused experts module under which a checkpoint's tensor `names` hold Int4Weights
    or Q6Weights per expert (a GGUF's, models/convert_experts.py), and put an empty Q6Linear in
    place of each expert linear held as a Q6Weight: a GGUF's Q6_K experts are kept as stored,
    streamed or not (the Int4Weights become Int4Linears as every other linear's do)."""
    names = list(names)
    q6 = q6_modules(names)
    split_experts(model, int4_modules(names) + q6)
    for name in q6:
        parent, _, linear_name = name.rpartition(".")
        owner = model.get_submodule(parent)
        if isinstance(owner, ExpertLinears):
            linear = getattr(owner, linear_name)
            with torch.device("meta"):
                setattr(owner, linear_name, Q6Linear(linear.in_features, linear.out_features, False, dtype))


def check_layout(name: str, module: nn.Module) -> None:
    different = {flag: getattr(module, flag, None) for flag, value in FUSED_LAYOUT.items()
                 if getattr(module, flag, None) != value}
    if different:
        raise SpecchatError(f"the experts at {name!r} are fused as {different}; only transformers' {FUSED_LAYOUT} "
                            "layout (Mixtral's, Qwen2-MoE's, Qwen3-MoE's) can be split per expert")
