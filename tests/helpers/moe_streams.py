"""MoE targets streamed by expert: the checkpoints (the moe fixture), each expert's bytes, the
routes each router took, and the bytes fetched per pass."""

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch
from helpers.gptq_moe_writer import EXPERTS, tiny_moe, write_moe_gptq_checkpoint
from helpers.moe import PROMPT, SPECS
from transformers import PreTrainedModel

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.offload.build import Offload

FAMILIES = ["mixtral", "qwen3_moe"]


@pytest.fixture(scope="module", params=FAMILIES)
def moe(request, tmp_path_factory) -> tuple[str, Path]:
    """(family, its GPTQ directory: act-order, groups of 32)."""
    directory = tmp_path_factory.mktemp(f"{request.param}-gptq")
    return request.param, write_moe_gptq_checkpoint(request.param, tiny_moe(request.param, 7), directory,
                                                     SPECS["g32-act-order-asym"])


def expert_bytes(model: PreTrainedModel) -> list[list[int]]:
    """Bytes of each expert's tensors, layer by layer, as `model` (in memory) holds them."""
    layers = model.model.layers
    return [[sum(t.nbytes for t in layer.mlp.experts.get_submodule(str(e)).state_dict().values()) for e in range(EXPERTS)]
            for layer in layers]


def record_routes(lm: CausalLM, indices: Iterable[int] | None = None) -> list[list[set[int]]]:
    """Per layer (those of `indices`; None: every one), the experts each call of its router picked
    (appended as calls happen)."""
    layers = lm.model.model.layers
    routes: list[list[set[int]]] = []
    for layer in layers if indices is None else [layers[i] for i in indices]:
        calls: list[set[int]] = []
        routes.append(calls)
        layer.skeleton.mlp.gate.register_forward_hook(
            lambda module, args, out, calls=calls: calls.append(set(out[2].flatten().tolist())))
    return routes


def passes(lm: CausalLM) -> Iterator[None]:
    """The prompt's pass, then one-token passes of its greedy continuation (a narrow pass each)."""
    cache = new_cache()
    tokens = torch.tensor(PROMPT)
    for position in range(len(PROMPT), len(PROMPT) + 4):
        hidden = lm.hidden(tokens, torch.arange(position - tokens.numel(), position), cache)
        tokens = lm.logits(hidden[-1:]).argmax(-1)
        yield


def fetched_per_pass(lm: CausalLM, offload: Offload, routes: list[list[set[int]]]) -> list[tuple[int, list[list[set[int]]]]]:
    """Per pass of `passes`: the bytes fetched during it, and each layer's router calls in it."""
    result, mark, seen = [], offload.stats().fetched_bytes, [0] * len(routes)
    for _ in passes(lm):
        now = offload.stats().fetched_bytes
        result.append((now - mark, [calls[count:] for calls, count in zip(routes, seen)]))
        mark, seen = now, [len(calls) for calls in routes]
    return result
