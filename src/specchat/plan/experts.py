"""How many of a MoE layer's experts a pass touches: what a layer streamed by expert will move."""

from specchat.errors import SpecchatError


def experts_touched(experts: int, routed: int, tokens: int) -> float:
    """The expected number of distinct experts `tokens` tokens route to in one MoE layer, each to
    `routed` (k) of its `experts` (E), the choices uniform and independent between tokens: one token
    misses a given expert with probability 1 - k/E, all n of them with (1 - k/E)^n, so
    E(1 - (1 - k/E)^n) experts are hit (k for one token, all E as n grows)."""
    if not 1 <= routed <= experts or tokens < 0:
        raise SpecchatError(f"{tokens} tokens routed to {routed} of {experts} experts: "
                            "need 1 <= experts per token <= experts and tokens >= 0")
    return experts * (1 - (1 - routed / experts) ** tokens)


def expert_share(experts: int, routed: int, tokens: int) -> float:
    """The share of a MoE layer's experts a pass over `tokens` tokens is expected to route to: of
    a layer streamed by expert, the share of its experts' bytes the pass moves."""
    return experts_touched(experts, routed, tokens) / experts
