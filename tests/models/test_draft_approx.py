"""The draft's approximations (int8 weights, a frequency-ranked sub-vocabulary head) as a draft
assembles them, and that decoding through an approximated - or deliberately wrong - draft still
emits exactly the target's tokens."""

import json

import pytest
import torch
from helpers.engines import run
from helpers.tiny import TinyCharTokenizer, build_tiny, perturbed, tiny_qwen_config
from transformers import Qwen2ForCausalLM

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import TreeShape
from specchat.decoding.tree_engine import TreeEngine
from specchat.models.draft_approx import DraftApprox, DroppedHead, approximate_draft
from specchat.models.draft_attention import DraftAttention
from specchat.models.vocab_rank import RANK_FILE
from specchat.models.fused_norms import FusedRMSNorm
from specchat.offload.host_embedding import host_lookup
from specchat.quant.int4 import Int4Linear
from specchat.quant.int4_rtn import round_linears
from specchat.quant.int8 import Int8Embedding, Int8Linear
from specchat.quant.stacked import Part

pytestmark = pytest.mark.slow  # tens of seconds: scheduled before the short modules (helpers/fixtures.py)

CPU = torch.device("cpu")
GREEDY, SEEDED = SamplingParams(0.0, 1.0, 0), SamplingParams(0.8, 0.9, 7)


def approximated(seed: int, tmp_path, vocab_size: int | None, int8: bool) -> CausalLM:
    draft = perturbed(build_tiny(0), 0.3, seed=seed)
    return approximate_draft(draft.model, TinyCharTokenizer(), tmp_path, int8, vocab_size, frozenset({49}))


def test_a_sub_vocabulary_head_scores_only_its_tokens(tmp_path):
    draft = approximated(1, tmp_path, vocab_size=20, int8=True)
    hidden = torch.randn(4, 32, dtype=torch.float64)
    logits = draft.logits(hidden)
    allowed = torch.zeros(50, dtype=torch.bool)
    allowed[draft.vocab] = True
    assert torch.isinf(logits[:, ~allowed]).all() and torch.isfinite(logits[:, allowed]).all()
    values, tokens = draft.top_logprobs(hidden, k=5, temperature=0.7)
    assert allowed[tokens].all() and torch.all(values[:, :-1] >= values[:, 1:])
    assert torch.allclose(values.exp().sum(-1), torch.log_softmax(logits / 0.7, -1).topk(5).values.exp().sum(-1))


def test_a_stop_token_past_the_models_rows_is_left_out_of_the_sub_vocabulary_head(tmp_path):
    """A tokenizer may add a stop token the model has no row for (a Qwen2 tokenizer's <|endoftext|>
    over a smaller vocabulary): the head keeps the stop tokens it can score."""
    (tmp_path / RANK_FILE).write_text(json.dumps(list(range(50))))  # ranked: no corpus to count
    model = perturbed(build_tiny(0), 0.3, seed=1).model
    draft = approximate_draft(model, TinyCharTokenizer(), tmp_path, False, 20, frozenset({49, 50}))
    assert draft.vocab.tolist() == [*range(20), 49]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("vocab_size, int8", [(20, True), (None, True), (10, False)])
def test_specexec_over_an_approximated_draft_emits_the_target_tokens(tiny_target, tmp_path, sampling, vocab_size, int8):
    draft = approximated(1, tmp_path, vocab_size, int8)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = TreeEngine(SPECEXEC, tiny_target, draft, [], TreeShape(budget=12, max_depth=6))
    assert run(engine, sampling)[0] == reference


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_prepared_for_cuda_is_stacked_and_its_replies_are_the_targets(tiny_target, sampling):
    """On CUDA every draft form's projections are stacked, its queries and keys rotated together,
    its norms fused, on a CPU only int8's projections stacked: the run's device decides, so this CPU prepares
    a draft for CUDA with its tensors where they are and runs it."""
    drafts = {kind: perturbed(build_tiny(0), 0.3, seed=1).model for kind in ("cuda", "cpu")}
    for kind, model in drafts.items():
        approx = DraftApprox(False, None, device=torch.device(kind))
        for layer in model.model.layers:
            approx.prepare_layer(layer)
        assert approx.draft(model).model is model
    assert isinstance(drafts["cuda"].model.norm, FusedRMSNorm)  # the final norm, once the layers are in
    stacked = [(type(layer.self_attn), type(layer.mlp.up_proj), type(layer.input_layernorm),
                layer.self_attn.config._attn_implementation) for layer in drafts["cuda"].model.layers]
    # its attention as built here; the app packs it as it builds or loads a model (bounded_attention.py)
    assert stacked == [(DraftAttention, Part, FusedRMSNorm, "sdpa")] * len(stacked)
    assert not any(isinstance(module, (Part, FusedRMSNorm, DraftAttention)) for module in drafts["cpu"].modules())
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = TreeEngine(SPECEXEC, tiny_target, CausalLM(drafts["cuda"]), [], TreeShape(budget=12, max_depth=6))
    assert run(engine, sampling)[0] == reference


def test_a_4_bit_draft_prepared_for_cuda_stacks_its_4_bit_projections_and_scores_as_before():
    """A draft stored in 4 bits (its linears rounded here, packed for this CPU) prepared for CUDA:
    its gate and up projections run as one 4-bit product, as its queries, keys and values do."""
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(tiny_qwen_config(vocab_size=96, hidden_size=128, intermediate_size=256)).eval()
    model.requires_grad_(False)  # as a loaded model is
    for layer in model.model.layers:
        assert round_linears(layer, torch.float32, CPU) == 7
    tokens = torch.tensor([[5, 17, 3, 88, 42]])
    before = model(tokens).logits
    approx = DraftApprox(False, None, device=torch.device("cuda"))
    for layer in model.model.layers:
        approx.prepare_layer(layer)
        assert type(layer.mlp.up_proj) is Part and isinstance(layer.mlp.gate_up_stack.linear, Int4Linear)
        assert isinstance(layer.self_attn, DraftAttention) and isinstance(layer.self_attn.qkv, Int4Linear)
    # the fused norms and rotation sum in another order: measured 1.2e-7 at most on logits of 0.73 (float32,
    # this test, the AMX Xeon, 2026-12-06)
    torch.testing.assert_close(model(tokens).logits, before, rtol=0, atol=2.4e-7)


class RandomDraft(CausalLM):
    """A deliberately wrong draft: its logits are noise, unrelated to anything it ran."""

    def logits(self, hidden):
        return torch.randn(hidden.shape[0], self.model.config.vocab_size)

    def top_logprobs(self, hidden, k, temperature, allowed=None):  # no grammar in these replies
        assert allowed is None
        return torch.log_softmax(self.logits(hidden), -1).topk(k, dim=-1)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_with_random_logits_still_gives_exact_output(tiny_target, tiny_draft, sampling):
    torch.manual_seed(5)
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    engine = TreeEngine(SPECEXEC, tiny_target, RandomDraft(tiny_draft.model), [], TreeShape(budget=12, max_depth=6))
    assert run(engine, sampling)[0] == reference


def test_an_int8_draft_looks_up_int8_rows_and_lets_its_whole_head_go(tmp_path):
    draft = approximated(1, tmp_path, vocab_size=20, int8=True)
    assert isinstance(draft.model.get_input_embeddings(), Int8Embedding)
    assert isinstance(draft.model.get_output_embeddings(), DroppedHead)
    with pytest.raises(RuntimeError, match="sub-vocabulary"):
        draft.model.get_output_embeddings()(torch.randn(1, 32, dtype=torch.float64))
    for vocab_size in (None, 50):  # no sub-vocabulary, or one of every token: the whole head, in int8
        whole = approximated(1, tmp_path, vocab_size=vocab_size, int8=True)
        assert isinstance(whole.model.get_output_embeddings(), Int8Linear) and whole.vocab is None


def test_a_draft_names_what_it_reads_from_the_checkpoint_into_host_ram():
    """int8 (on a CPU) replaces the embedding and the head from the file's mapped tensors; an input
    embedding held on the host is read there, never onto a GPU; nothing else is named."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(tiny_qwen_config(tie_word_embeddings=False))
    assert DraftApprox(True, None).mapped(model) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert DraftApprox(False, None, host_embedding=True).on_host(model) == {"model.embed_tokens.weight"}
    assert DraftApprox(True, None).on_host(model) == DraftApprox(False, None).mapped(model) == set()


def test_an_embedding_held_on_the_host_is_a_copy_there_and_anchors_the_model_on_its_device():
    """The tensor `hold_embedding_on_host` is given is the checkpoint's memory map (models/layerwise.py:
    what a preparation replaces is never copied for it), so the table it keeps is a copy, in the run's
    dtype, on the host; the model reads as on the draft's device (a meta device stands for a GPU here)."""
    model = Qwen2ForCausalLM(tiny_qwen_config(tie_word_embeddings=False))
    mapped = model.get_input_embeddings().weight.detach()
    DraftApprox(False, None, device=torch.device("meta"), host_embedding=True).hold_embedding_on_host(model,
                                                                                                       torch.float32)
    table = host_lookup(model)
    assert torch.equal(table.weight, mapped) and table.weight.untyped_storage().data_ptr() != mapped.data_ptr()
    assert (table.weight.device.type, table.weight.dtype) == ("cpu", torch.float32)
    assert next(model.parameters()).device.type == "meta"  # transformers' model.device: its first parameter
