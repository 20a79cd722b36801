"""SpecExec over a MoE target of real weights: the embedded 0.5B upcycled into a Qwen2-MoE
(tests/helpers/moe_upcycle.py: its MLP into 8 experts that differ, each the MLP less its own eighth of the
channels, 2 routed a token by a random router, in its last three layers), the experts RTN 4-bit
GPTQ and the other linears float16, run in bf16, with the app's embedded draft, the dense 0.5B
(the 1.5B upcycled took 600 s and 13.4 GB here; the 0.5B keeps what the test shows at a fraction).
Its first 21 layers stay resident; the three MoE layers stream from the disk through a 2-slot ring,
by expert, with no expert waiting on the device, so a call fetches the experts its router picked
that its slot lacks.

- Greedy and seeded replies are transformers' own (greedy `generate`, seeded tests/helpers/reference_loop.py)
  on its Qwen2-MoE holding the checkpoint's weights in bf16, read apart from specchat's loader
  (moe_upcycle.dense_reference), up to near-ties under test_real_defaults' bf16 bounds; the draft's
  tokens are accepted (the upcycled model writes as the dense 0.5B does: a random MoE target
  accepts nothing, tests/offload/test_moe_streaming.py).
- That check catches a routing error: the greedy reply fails it against the reference with its
  experts in reverse order, or with every token routed one expert over.
- A one-token pass after a one-token pass fetches exactly the experts its routers picked, counted
  from the routers' outputs.
"""

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from helpers.real_pair import GREEDY_NEW_TOKENS as NEW_TOKENS
from helpers.real_pair import real_draft
from helpers.moe_upcycle import dense_reference, write_upcycled
from helpers.reference_loop import assert_transformers_tokens
from helpers.engines import GREEDY
from helpers.moe_streams import record_routes
from test_real_defaults import BF16_MAX_TIES, BF16_MAX_TIES_APART, BF16_NEAR_TIES, DEFAULT_SAMPLING
from transformers import PreTrainedModel

from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.heap_trim import release_free_heap
from specchat.models.embedded import ensure_embedded
from specchat.models.loading import load_tokenizer
from specchat.models.registry import DEFAULT_DRAFT
from specchat.offload.build import Offload, offload_model
from specchat.plan.machine import Machine
from specchat.plan.model import plan_checkpoint
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant.int4 import Int4Linear
from specchat.runtime import encode_prompt

pytestmark = pytest.mark.real

EXPERTS, TOP_K = 8, 2  # as docs/moe.md's measurements
MOE_LAYERS = 3  # the last three, through a 2-slot ring: no slot keeps its layer from pass to pass
SAMPLINGS, SAMPLING_IDS = [GREEDY, DEFAULT_SAMPLING], ["greedy", "seeded"]


@dataclasses.dataclass
class MoePair:
    target: CausalLM
    draft: CausalLM
    stop_ids: frozenset[int]
    prompt: list[int]
    offload: Offload
    moe_layers: list[int]
    reference: PreTrainedModel  # transformers' own bf16 model of its weights (moe_upcycle.dense_reference)


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory, mtbench_prompts) -> Iterator[MoePair]:
    """The draft first, its preparation's ~3 GB of temporaries while nothing else is held, each step's
    freed heap returned before the next loads (as the real_pair fixture does). Measured with
    /usr/bin/time on the 2-core machine: the module's peak RSS 5.57 GB, 6.2 with the reference built
    last; within the REAL_MODULE_RAM (10 GiB, tests/helpers/ram_turns.py) reserved for a real module."""
    dense = ensure_embedded(DEFAULT_DRAFT, progress=False)
    layers = json.loads((dense / "config.json").read_text())["num_hidden_layers"]
    moe_layers = list(range(layers - MOE_LAYERS, layers))
    directory = write_upcycled(dense, tmp_path_factory.mktemp("upcycled") / "moe", EXPERTS, TOP_K, moe_layers,
                               quantize_dense=False)
    draft = real_draft()
    release_free_heap()
    reference = dense_reference(directory, torch.bfloat16)
    release_free_heap()
    offload_dir = tmp_path_factory.mktemp("offload")
    request = PlanRequest(tier="disk", offload_dir=offload_dir, resident_layers=layers - MOE_LAYERS, slots=2)
    placement = plan_checkpoint(directory, "upcycled", torch.bfloat16, Machine(kind="cpu"), request).placement
    assert placement.streamed == tuple(moe_layers)
    model, offload = offload_model(directory, "upcycled", torch.bfloat16, torch.device("cpu"),
                                   dataclasses.replace(placement, expert_cache=0), offload_dir, Reporter(bars=False))
    release_free_heap()
    tokenizer = load_tokenizer(str(directory), progress=False)
    try:
        yield MoePair(CausalLM(model, offload), draft, stop_token_ids(model, tokenizer),
                      encode_prompt(tokenizer, mtbench_prompts[0], raw=False), offload, moe_layers, reference)
    finally:
        offload.close()


@pytest.fixture(scope="module")
def replies() -> dict[SamplingParams, list[int]]:
    """SpecExec's replies by sampling, kept for the mutation test (decoded there when run alone)."""
    return {}


def tokens_and_events(engine, pair: MoePair, sampling) -> tuple[list[int], list]:
    events = list(engine.generate(pair.prompt, NEW_TOKENS, sampling))
    return [t for e in events for t in e.token_ids], events


def specexec(pair: MoePair) -> TreeEngine:
    return TreeEngine(SPECEXEC, pair.target, pair.draft, pair.stop_ids, TreeShape(budget=32))


def max_ties(pair: MoePair, sampling: SamplingParams) -> int:
    """test_real_defaults' bound: more greedy ties where tree passes run dense copies of the int4 weights."""
    copies = any(isinstance(m, Int4Linear) and m.dense is not None for m in pair.target.model.modules())
    return (BF16_MAX_TIES_APART if copies else BF16_MAX_TIES)[sampling]


def assert_reference_reply(pair: MoePair, reference: PreTrainedModel, tokens: list[int],
                           sampling: SamplingParams) -> list[tuple[int, float]]:
    return assert_transformers_tokens(reference, pair.prompt, tokens, NEW_TOKENS, sampling, pair.stop_ids,
                                      BF16_NEAR_TIES[sampling], max_ties(pair, sampling))


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_specexec_over_the_upcycled_moe_gives_transformers_tokens_for_its_weights(moe_pair, replies, sampling):
    tokens, events = tokens_and_events(specexec(moe_pair), moe_pair, sampling)
    replies[sampling] = tokens
    ties = assert_reference_reply(moe_pair, moe_pair.reference, tokens, sampling)
    print(f"{len(tokens)} tokens in {len(events)} passes, near-ties against transformers {ties}")
    assert len(tokens) / len(events) > 2  # tokens a target pass: the draft predicts the upcycled 0.5B


@contextmanager
def reordered_experts(reference: PreTrainedModel, layers: list[int], order: list[int]) -> Iterator[None]:
    """Expert e of each of `layers` holds expert order[e]'s weights (a route to another one), then back."""
    experts = [reference.model.layers[layer].mlp.experts for layer in layers]

    def permute(permutation: torch.Tensor) -> None:
        for module in experts:
            for weight in (module.gate_up_proj, module.down_proj):
                weight.copy_(weight[permutation])  # indexing copies first

    permute(torch.tensor(order))
    try:
        yield
    finally:
        permute(torch.argsort(torch.tensor(order)))


@contextmanager
def routed_one_over(reference: PreTrainedModel, layers: list[int], monkeypatch) -> Iterator[None]:
    """Every token of `layers` sent to the experts after the ones its router picked (e -> e + 1 mod E)."""
    with monkeypatch.context() as patch:
        for layer in layers:
            experts = reference.model.layers[layer].mlp.experts
            patch.setattr(experts, "forward", lambda hidden, index, weights, run=experts.forward:
                          run(hidden, (index + 1) % EXPERTS, weights))
        yield


# Measured on the upcycled 1.5B: two experts swapped (0 and 1) left the greedy reply's 32 tokens as
# they were, so the experts' order is reversed here, every expert then computing with another's channels.
@pytest.mark.parametrize("mutation", ["experts in reverse order", "routed one expert over"])
def test_the_reference_check_fails_a_reply_of_another_routing(moe_pair, replies, monkeypatch, mutation):
    """The experts differ, so routing shows in the tokens: SpecExec's greedy reply, which passes the
    check above, fails it against the reference with a routing error, as an engine's reply with that
    error would fail it against the true reference (with copies of one MLP, neither would show)."""
    if GREEDY not in replies:  # run alone: decode it here
        replies[GREEDY], _ = tokens_and_events(specexec(moe_pair), moe_pair, GREEDY)
    reference = moe_pair.reference
    routing = reordered_experts(reference, moe_pair.moe_layers, list(reversed(range(EXPERTS)))) \
        if mutation == "experts in reverse order" else routed_one_over(reference, moe_pair.moe_layers, monkeypatch)
    with routing, pytest.raises(AssertionError, match="token|near-ties"):
        assert_reference_reply(moe_pair, reference, replies[GREEDY], GREEDY)


def test_a_one_token_pass_fetches_the_experts_its_router_picked(moe_pair):
    """Measured on the second one-token pass after the prompt's: the prompt's wide calls had the ring
    load the first one's layers whole (offload/experts.py, WHOLE_SHARE), the narrow calls then
    have it load heads, so the second one fetches every expert it computes with."""
    routes = record_routes(moe_pair.target, moe_pair.moe_layers)  # hooks left on: they only record
    skeleton = moe_pair.target.model.model.layers[moe_pair.moe_layers[0]].skeleton
    expert = sum(t.nbytes for t in skeleton.mlp.experts.get_submodule("0").state_dict().values())
    tokens = moe_pair.prompt + moe_pair.prompt[-2:]  # the prompt, then two tokens one at a time
    cache = new_cache()
    for start, end in ((0, len(moe_pair.prompt)), (len(moe_pair.prompt), len(tokens) - 1)):
        moe_pair.target.hidden(torch.tensor(tokens[start:end]), torch.arange(start, end), cache)
    before, seen = moe_pair.offload.stats().fetched_bytes, [len(calls) for calls in routes]
    moe_pair.target.hidden(torch.tensor(tokens[-1:]), torch.tensor([len(tokens) - 1]), cache)
    fetched = moe_pair.offload.stats().fetched_bytes - before
    picked = [set().union(*calls[count:]) for calls, count in zip(routes, seen)]
    assert [len(experts) for experts in picked] == [TOP_K] * len(moe_pair.moe_layers)
    assert fetched == len(moe_pair.moe_layers) * TOP_K * expert
