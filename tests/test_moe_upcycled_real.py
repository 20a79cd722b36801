"""SpecExec over a MoE target of real weights: the embedded 1.5B upcycled into a Qwen2-MoE
(tests/moe_upcycle.py: its MLP copied into 4 experts, one routed a token by a random router, in its
last three layers), the experts RTN 4-bit GPTQ and the other linears float16, run in bf16, with the
app's embedded 0.5B draft. Its first 25 layers stay
resident; the three MoE layers stream from the disk through a 2-slot ring, by expert, with no expert
waiting on the device, so a call fetches the experts its router picked that its slot lacks.

- Greedy and seeded replies are the target's bf16 autoregressive decoding's up to near-ties, under
  test_real_defaults' bf16 bounds; the draft's tokens are accepted (it predicts the upcycled model as
  it predicts the 1.5B: a random MoE target accepts nothing, tests/test_moe_streaming.py).
- A one-token pass after a one-token pass fetches exactly the experts its routers picked, counted
  from the routers' outputs.
"""

import dataclasses
import json
from collections.abc import Iterator

import pytest
import torch
from conftest import GREEDY_NEW_TOKENS as NEW_TOKENS
from conftest import real_draft
from exactness import ExactnessCheck
from moe_upcycle import write_upcycled
from test_engines import GREEDY
from test_moe_streaming import record_routes
from test_real_defaults import BF16_MAX_TIES, BF16_MAX_TIES_WITH_COPIES, BF16_NEAR_TIES, DEFAULT_SAMPLING

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.stopping import stop_token_ids
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.embedded import ensure_embedded
from specchat.models.loading import load_tokenizer
from specchat.models.registry import DEFAULT_TARGET
from specchat.offload.build import Offload, offload_model
from specchat.plan.machine import Machine
from specchat.plan.model import plan_checkpoint
from specchat.plan.request import PlanRequest
from specchat.progress import Reporter
from specchat.quant.int4 import Int4Linear
from specchat.runtime import encode_prompt

pytestmark = pytest.mark.real

EXPERTS, TOP_K = 4, 1
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


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory, mtbench_prompts) -> Iterator[MoePair]:
    dense = ensure_embedded(DEFAULT_TARGET, progress=False)
    layers = json.loads((dense / "config.json").read_text())["num_hidden_layers"]
    moe_layers = list(range(layers - MOE_LAYERS, layers))
    directory = write_upcycled(dense, tmp_path_factory.mktemp("upcycled") / "moe", EXPERTS, TOP_K, moe_layers,
                               quantize_dense=False)
    offload_dir = tmp_path_factory.mktemp("offload")
    request = PlanRequest(tier="disk", offload_dir=offload_dir, resident_layers=layers - MOE_LAYERS, slots=2)
    placement = plan_checkpoint(directory, "upcycled", torch.bfloat16, Machine(kind="cpu"), request).placement
    assert placement.streamed == moe_layers
    model, offload = offload_model(directory, "upcycled", torch.bfloat16, torch.device("cpu"),
                                   dataclasses.replace(placement, expert_cache=0), offload_dir, Reporter(bars=False))
    tokenizer = load_tokenizer(str(directory), progress=False)
    try:
        yield MoePair(CausalLM(model, offload), real_draft(), stop_token_ids(model, tokenizer),
                      encode_prompt(tokenizer, mtbench_prompts[0], raw=False), offload, moe_layers)
    finally:
        offload.close()


def tokens_and_events(engine, pair: MoePair, sampling) -> tuple[list[int], list]:
    events = list(engine.generate(pair.prompt, NEW_TOKENS, sampling))
    return [t for e in events for t in e.token_ids], events


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=SAMPLING_IDS)
def test_specexec_over_the_upcycled_moe_gives_its_autoregressive_tokens(moe_pair, sampling):
    reference, _ = tokens_and_events(AutoregressiveEngine(moe_pair.target, moe_pair.stop_ids), moe_pair, sampling)
    engine = TreeEngine(SPECEXEC, moe_pair.target, moe_pair.draft, moe_pair.stop_ids, TreeShape(budget=32))
    tokens, events = tokens_and_events(engine, moe_pair, sampling)
    copies = any(isinstance(m, Int4Linear) and m.dense is not None for m in moe_pair.target.model.modules())
    max_ties = (BF16_MAX_TIES_WITH_COPIES if copies else BF16_MAX_TIES)[sampling]
    check = ExactnessCheck(moe_pair.target, moe_pair.stop_ids, NEW_TOKENS, BF16_NEAR_TIES[sampling], max_ties)
    comparison = check.compare(moe_pair.prompt, reference, tokens, sampling)
    print(f"{len(tokens)} tokens in {len(events)} passes, {comparison.describe()}")
    assert comparison.acceptable, comparison.describe()
    assert len(tokens) / len(events) > 2  # tokens a target pass: the draft predicts the upcycled 1.5B


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
