"""Every model's attention (bounded_attention.py): grouped query heads packed as rows give what
transformers' copied keys and values give, the calls give what one call gives, a pass small
enough is transformers' own path, a fused kernel takes every row at once, and every model the app
builds or loads gets it. What a call holds, measured: tests/scripts/test_attention_memory.py."""

import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from gpu_checks.tree_passes import prefilled, random_tree, tree_pass
from helpers.attention import Attention, drawn
from helpers.cli import tiny_dirs  # noqa: F401 (a fixture)
from helpers.tiny import build_tiny, perturbed, tiny_qwen_config
from torch.nn.attention import SDPBackend
from transformers import Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specchat import bounded_attention
from specchat.bounded_attention import (
    ALL_BACKENDS,
    ATTENTION_BYTES,
    GROUPED,
    LEAST_ROWS,
    MATH_BYTES_PER_SCORE,
    NAME,
    attention_bytes,
    backends_for,
    bound_attention,
    bounded_sdpa,
    fused_kernel_takes,
    fused_serves,
    grouped_sdpa,
    kernels_for,
    mask_rows_per_call,
    rows_per_call,
)
from specchat.checkpoint.skeleton import build_skeleton
from specchat.cuda_graph import repeating_shapes
from specchat.decoding.forward import CausalLM
from specchat.engine_options import EngineOptions
from specchat.loader import load_target, plan_run
from specchat.models.loading import load
from specchat.plan import resolve_weights
from specchat.progress import Reporter

CPU = torch.device("cpu")
# float32: a row's sums run over the same keys whatever the call, but a kernel's blocking follows its
# rows: 0 for these drawn rows, 2.4e-7 through the tiny model's strided queries (one rounding; the
# AMD EPYC, 2026-11-29): twice that
ROUNDING = 4.8e-7


def calls_of(monkeypatch, rows: int) -> list[int]:
    """Bound the calls at `rows` query rows; the rows of each SDPA call are recorded in the list returned."""
    monkeypatch.setattr(bounded_attention, "rows_per_call", lambda heads, keys: rows)
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def recorded(query, *args, **kwargs):
        seen.append(query.shape[2])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    return seen


def test_a_call_holds_as_many_rows_as_the_bound_allows_and_the_plan_counts_it():
    # a 70B's 64 heads over 4096 + 2049 keys: 256 MiB hold 68.3 rows of 64 x 6145 scores at 10 bytes
    assert rows_per_call(64, 6145) == 68 and 68 * 64 * 6145 * MATH_BYTES_PER_SCORE <= ATTENTION_BYTES
    assert rows_per_call(64, 10**6) == LEAST_ROWS  # past the bound: calls of 16 rows still
    # grouped (8 KV heads for 64), packed. On the math path: its 8 KV heads' keys and values widened
    # to float32, a call's scores and its mask repeated for 8 query heads and widened (6 bytes an
    # entry), 68 rows; on a fused kernel: calls of as many rows as 256 MiB hold of the repeated mask
    # and its aligned copy (910 rows of 8 x 6145 at 6 bytes), 4 bytes an entry. The larger: the math path
    assert mask_rows_per_call(8, 6145, 2) == 910
    math = 2 * 8 * 6145 * 128 * 4 + 68 * 64 * 6145 * 10 + 68 * 8 * 6145 * 6
    assert attention_bytes(64, 8, 128, 2049, 6145, 2) == max(math, 910 * 8 * 6145 * 4) == math
    # a small pass in float32 (nothing to widen): its whole scores
    assert attention_bytes(32, 32, 128, 10, 100, 4) == 10 * 32 * 100 * 10


@pytest.mark.parametrize("additive", [True, False], ids=["float-mask", "bool-mask"])
@pytest.mark.parametrize("groups", [1, 3])
def test_calls_give_what_one_call_gives(monkeypatch, groups, additive):
    query, key, value, attend = drawn(groups, rows=50, keys=70)
    mask = torch.zeros(attend.shape).masked_fill(~attend, float("-inf")) if additive else attend
    whole, _ = sdpa_attention_forward(Attention(groups), query, key, value, mask, scaling=0.25)
    seen = calls_of(monkeypatch, 16)
    parts, _ = bounded_sdpa(Attention(groups), query, key, value, mask, scaling=0.25)
    assert seen == [13, 13, 12, 12]  # four calls evened out, never one of a single row
    assert parts.shape == whole.shape == (1, 50, 2 * groups, 16)
    torch.testing.assert_close(parts, whole, rtol=0, atol=ROUNDING)


def test_a_pass_within_the_bound_or_without_a_mask_is_transformers_own(monkeypatch):
    query, key, value, attend = drawn(2, rows=16, keys=40)
    monkeypatch.setattr(bounded_attention, "sdpa_attention_forward", lambda *args, **kwargs: ("transformers", None))
    seen = calls_of(monkeypatch, 16)
    assert bounded_sdpa(Attention(2), query, key, value, attend)[0] == "transformers"
    assert bounded_sdpa(Attention(2), torch.cat([query] * 4, dim=2), key, value, None)[0] == "transformers"
    assert seen == []


def test_where_a_fused_kernel_serves_every_row_goes_in_one_call(monkeypatch):
    query, key, value, attend = drawn(2, rows=50, keys=40)
    seen = calls_of(monkeypatch, 16)
    monkeypatch.setattr(bounded_attention, "fused_serves", lambda *tensors: True)
    bounded_sdpa(Attention(2), query, key, value, attend)
    assert seen == [50]


def test_cuda_calls_leave_out_cudnn_which_plans_each_shape_but_where_shapes_repeat():
    """A target pass's keys grow every iteration (a cuDNN plan each pass); a static draft step's
    and a capture's shapes repeat, its warm-ups and the capture in one scope."""
    on_cuda, on_cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)  # all backends_for reads
    assert set(backends_for(on_cuda)) == {SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH}
    assert backends_for(on_cpu) == list(ALL_BACKENDS)
    with repeating_shapes():
        assert backends_for(on_cuda) == list(ALL_BACKENDS)
        with repeating_shapes():
            assert backends_for(on_cuda) == list(ALL_BACKENDS)
        assert backends_for(on_cuda) == list(ALL_BACKENDS)  # an inner scope's end leaves the outer one
    assert SDPBackend.CUDNN_ATTENTION not in backends_for(on_cuda)


def test_every_sdpa_call_runs_within_the_kernels_chosen_for_its_query(monkeypatch):
    """Bounded calls, packed calls and transformers' own path each run within kernels_for(query)."""
    monkeypatch.setattr(bounded_attention, "rows_per_call", lambda heads, keys: 16)  # 40 rows: three calls
    scopes, ran_in = [None], []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    @contextmanager
    def recorded_scope(query):
        scopes.append(query.shape)
        yield
        scopes.append(None)

    def recorded_sdpa(query, *args, **kwargs):
        ran_in.append(scopes[-1])
        return real_sdpa(query, *args, **kwargs)

    monkeypatch.setattr(bounded_attention, "kernels_for", recorded_scope)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded_sdpa)
    query, key, value, attend = drawn(2, rows=40, keys=30)
    bounded_sdpa(Attention(2), query, key, value, attend)
    grouped_sdpa(Attention(2), query, key, value, attend)
    bounded_sdpa(Attention(2), query, key, value, None)  # transformers' own path
    assert len(ran_in) == 3 + 3 + 1 and all(scope is not None for scope in ran_in)


def test_a_cuda_query_runs_sdpa_without_cudnn_and_a_cpus_as_it_is():
    """kernels_for's scope sets torch's SDPA flags (global, restored after) on CUDA alone."""
    on_cuda, on_cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with kernels_for(on_cuda):
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with repeating_shapes(), kernels_for(on_cuda):
        assert torch.backends.cuda.cudnn_sdp_enabled()
    with kernels_for(on_cpu):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_cuda_calls_in_two_threads_set_their_flags_one_at_a_time(monkeypatch):
    """A DSI target thread's call (no cuDNN) and a drafter's capture (cuDNN kept) never run under
    each other's flags: the second waits on the lock for the first's scope to end. Decided by events,
    not by time: the drafter reports when it reaches the lock, and while this thread holds it the
    drafter cannot have set a flag."""
    flags, reached, seen, tester = threading.Lock(), threading.Event(), [], threading.current_thread()

    class ReportingLock:
        """SDPA_FLAGS, reporting another thread that reaches it before it waits."""

        def __enter__(self) -> None:
            if threading.current_thread() is not tester:
                reached.set()
            flags.acquire()

        def __exit__(self, *exc: object) -> None:
            flags.release()

    def drafter() -> None:
        try:
            with repeating_shapes(), kernels_for(SimpleNamespace(is_cuda=True)):
                seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        finally:
            reached.set()  # a drafter that never reached the lock must not leave this test waiting

    monkeypatch.setattr(bounded_attention, "SDPA_FLAGS", ReportingLock())
    thread = threading.Thread(target=drafter)
    with kernels_for(SimpleNamespace(is_cuda=True)):
        thread.start()
        reached.wait()
        assert seen == [] and flags.locked()  # the drafter waits at the lock this scope holds
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    thread.join()
    assert seen == [True]


def test_only_cuda_is_asked_whether_a_fused_kernel_serves():
    query, key, value, attend = drawn(1, rows=20, keys=30)
    assert not fused_serves(query, key, value, attend)  # a CPU's flash kernel cannot be asked: bounded
    # the checks CUDA is asked through, built as there (torch's signature): a CPU's tensors pass none
    assert not fused_kernel_takes(query, key, value, attend)


@pytest.mark.parametrize("additive", [True, False], ids=["float-mask", "bool-mask"])
@pytest.mark.parametrize("groups", [2, 4])
def test_packed_rows_give_what_copied_keys_and_values_give(groups, additive):
    query, key, value, attend = drawn(groups)
    mask = torch.zeros(attend.shape).masked_fill(~attend, float("-inf")) if additive else attend
    packed, _ = grouped_sdpa(Attention(groups), query, key, value, mask, scaling=0.25)
    copied, _ = sdpa_attention_forward(Attention(groups), query, key, value, mask, scaling=0.25)
    assert packed.shape == copied.shape == (1, 5, 2 * groups, 16)
    # float32, bit for bit on the AMD EPYC (2026-11-28): each row's sum runs over the same keys in order
    assert torch.equal(packed, copied)


def test_packed_rows_in_bounded_calls_give_what_one_call_gives(monkeypatch):
    query, key, value, attend = drawn(4, rows=40, keys=50)
    whole, _ = grouped_sdpa(Attention(4), query, key, value, attend)
    seen = calls_of(monkeypatch, 16)
    parts, _ = grouped_sdpa(Attention(4), query, key, value, attend)
    assert seen == [4 * 14, 4 * 13, 4 * 13]  # three calls, each a KV head's 4 query heads as rows
    torch.testing.assert_close(parts, whole, rtol=0, atol=ROUNDING)


def test_without_a_mask_shared_by_the_heads_it_is_bounded_sdpas():
    query, key, value, attend = drawn(2)
    per_head = torch.zeros(1, 4, 5, 12).masked_fill(~attend.expand(1, 4, 5, 12), float("-inf"))
    for mask in (None, per_head):
        assert torch.equal(grouped_sdpa(Attention(2), query, key, value, mask)[0],
                           sdpa_attention_forward(Attention(2), query, key, value, mask)[0])


def test_a_models_attentions_get_it_a_model_sharing_their_config_keeps_sdpa_and_a_tree_pass_is_as_before(
        monkeypatch):
    target = build_tiny(0, dtype=torch.float32)
    lm = perturbed(target, 0.1, seed=1)  # its modules share the target's config object
    tree = random_tree(40, 20, 50)
    whole = tree_pass(lm, prefilled(lm, 20), 20, tree)
    assert bound_attention(lm.model) == lm.model.config.num_hidden_layers
    assert bound_attention(lm.model) == 0  # none left on transformers' SDPA
    assert lm.model.config._attn_implementation == "sdpa"  # the model's own config: its masks as before
    assert {layer.self_attn.config._attn_implementation for layer in lm.model.model.layers} == {GROUPED}
    assert lm.model.config is target.model.config
    assert all(layer.self_attn.config._attn_implementation == "sdpa" for layer in target.model.model.layers)
    # float32, bit for bit here (the AMD EPYC, 2026-11-29): packed rows and copied keys alike
    assert torch.equal(tree_pass(lm, prefilled(lm, 20), 20, tree), whole)
    seen = calls_of(monkeypatch, 16)
    torch.testing.assert_close(tree_pass(lm, prefilled(lm, 20), 20, tree), whole, rtol=0, atol=ROUNDING)
    layers, groups = lm.model.config.num_hidden_layers, lm.model.model.layers[0].self_attn.num_key_value_groups
    # the causal prefix unmasked (transformers' one call), then each tree pass in three packed calls
    assert seen == [20] * layers + [groups * 14, groups * 13, groups * 13] * layers


def test_an_attention_without_grouped_heads_runs_a_tree_pass_in_bounded_calls_as_before(monkeypatch):
    torch.manual_seed(0)
    config = tiny_qwen_config(num_key_value_heads=4, vocab_size=50, attn_implementation="sdpa")
    lm = CausalLM(Qwen2ForCausalLM(config).eval())
    tree = random_tree(40, 20, 50)
    whole = tree_pass(lm, prefilled(lm, 20), 20, tree)
    assert bound_attention(lm.model) == config.num_hidden_layers and implementations(lm.model) == {NAME}
    seen = calls_of(monkeypatch, 16)
    torch.testing.assert_close(tree_pass(lm, prefilled(lm, 20), 20, tree), whole, rtol=0, atol=ROUNDING)
    assert seen == [20] * config.num_hidden_layers + [14, 13, 13] * config.num_hidden_layers


def test_a_mask_broadcast_over_the_rows_goes_whole_to_every_call(monkeypatch):
    query, key, value, attend = drawn(2, rows=50, keys=40)
    row = attend[..., :1, :]  # [1, 1, 1, keys]: every row sees the same keys
    whole, _ = sdpa_attention_forward(Attention(2), query, key, value, row, scaling=0.25)
    seen = calls_of(monkeypatch, 16)
    for attention in (bounded_sdpa, grouped_sdpa):
        parts, _ = attention(Attention(2), query, key, value, row, scaling=0.25)
        torch.testing.assert_close(parts, whole, rtol=0, atol=ROUNDING)
    assert seen == [13, 13, 12, 12] + [2 * 13, 2 * 13, 2 * 12, 2 * 12]


@pytest.mark.parametrize("offload", ["none", "disk"], ids=["in-memory", "streamed"])
def test_the_loader_bounds_a_targets_attention_in_memory_and_streamed(tiny_dirs, tmp_path, offload):  # noqa: F811
    options = resolve_weights(EngineOptions(target=str(tiny_dirs[0]), dtype="float32", offload=offload,
                                            offload_dir=str(tmp_path), resident_layers=0 if offload == "disk" else None))
    memory = plan_run(options, CPU, False, Reporter(bars=False))
    target, streamed = load_target(options, CPU, torch.float32, memory, Reporter(bars=False))
    try:
        assert bool(memory.placement.streamed) == (offload == "disk")
        assert implementations(target.model) == {GROUPED}  # 4 query heads on 2 KV heads
    finally:
        if streamed is not None:
            streamed.close()


def test_every_model_the_app_builds_or_loads_attends_in_bounded_calls(tiny_dirs):  # noqa: F811
    skeleton = build_skeleton(tiny_qwen_config(), None, torch.float32)  # streamed layers and layerwise loads
    loaded = load(str(tiny_dirs[1]), torch.float32, progress=False).model  # transformers' own loading
    ungrouped = build_skeleton(tiny_qwen_config(num_key_value_heads=4), None, torch.float32)
    assert implementations(skeleton) == implementations(loaded) == {GROUPED} and implementations(ungrouped) == {NAME}


def implementations(model) -> set[str]:
    return {layer.self_attn.config._attn_implementation for layer in model.model.layers}
