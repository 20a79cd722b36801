"""The GPU check's checks as tests, on a CUDA host: marked `cuda` (pytest -m cuda runs them
alone) and skipped where torch sees no CUDA device. scripts/gpu_check.sh runs the same functions
(tests/gpu_checks/) and prints them as a table."""

import threading
from types import SimpleNamespace

import pytest
import torch
from gpu_checks.auto_offload import check_auto_offload
from gpu_checks.bandwidth import check_bandwidth
from gpu_checks.capture_beside_loads import check_capture_beside_loads
from gpu_checks.captured_draft import check_captured_draft
from gpu_checks.drafts import check_draft
from gpu_checks.dsi_captured import check_dsi_captured
from gpu_checks.expanded_specexec import check_expanded_specexec
from gpu_checks.int4_reference import check_int4_reference
from gpu_checks.moe_streamed import check_moe_streamed
from gpu_checks.probe_costs import CAP, check_probe, wide_target
from gpu_checks.replies import GreedyJudge
from gpu_checks.streamed_logits import check_gptq_streamed, check_ring_reuse
from gpu_checks.tiny_models import wide_config
from gpu_checks.verdict import Verdict

from specchat.bounded_attention import bounded_sdpa, grouped_sdpa
from specchat.cuda_graph import repeating_shapes
from specchat.host_pull import HostSender, pull
from specchat.models.draft import DraftQuant
from specchat.models.draft_step import measure_step
from specchat.offload.cuda import CudaMover
from specchat.quant.fp8 import FP8_MAX, INVERSE_MAX, TINY, fp8_runs_on, quantize_rows
from specchat.quant.fp8_rows import quantize_rows_fused

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: these tests check a GPU")]
CUDA = torch.device("cuda")
REPLIES_TIMEOUT_S = 3600  # default-pair replies through the command line; the first may convert the models


def assert_holds(verdict: Verdict) -> None:
    if verdict.status == "SKIP":
        pytest.skip(verdict.detail)
    assert verdict.status == "PASS", verdict.detail


@pytest.fixture(scope="module")
def judge(tmp_path_factory) -> GreedyJudge:
    return GreedyJudge(tmp_path_factory.mktemp("replies"))


@pytest.mark.parametrize(("family", "slots"), [("llama", 2), ("qwen2", 3)])
def test_a_ring_smaller_than_a_pass_is_reused_and_matches_the_model_in_memory(offload_dir, family, slots):
    assert_holds(check_ring_reuse(family, slots, CUDA, offload_dir))


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_a_gptq_target_streamed_matches_the_gptq_model_in_memory(offload_dir, tier):
    assert_holds(check_gptq_streamed(tier, CUDA, offload_dir))


@pytest.mark.timeout(REPLIES_TIMEOUT_S)
@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_a_quantized_draft_replies_as_the_target_does(judge, kind):
    assert_holds(check_draft(kind, judge, CUDA))


def test_the_probe_costs_what_passes_measure(offload_dir):
    assert_holds(check_probe(wide_target(CUDA, offload_dir), CAP))


@pytest.mark.timeout(REPLIES_TIMEOUT_S)
def test_offload_auto_under_a_vram_budget_streams_and_replies_as_the_target_does(judge):
    assert_holds(check_auto_offload(judge, CUDA))


def test_streamed_bandwidth_matches_the_doctor_probe(offload_dir):
    assert_holds(check_bandwidth(CUDA, offload_dir))


def test_the_int4_products_at_70b_shapes_match_an_independent_float64_reference():
    assert_holds(check_int4_reference(CUDA))


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_a_moe_target_streamed_by_expert_matches_the_model_in_memory(offload_dir, tier):
    assert_holds(check_moe_streamed(tier, CUDA, offload_dir))


def test_bf16_specexec_with_wide_passes_expanded_emits_the_autoregressive_tokens(tmp_path):
    assert_holds(check_expanded_specexec(CUDA, tmp_path))


def test_the_draft_step_captured_in_cuda_graphs_grows_the_eager_trees():
    assert_holds(check_captured_draft(CUDA))


def test_an_int4_draft_step_captured_in_cuda_graphs_grows_the_eager_trees():
    assert_holds(check_captured_draft(CUDA, "int4"))


def test_an_fp8_draft_step_captured_in_cuda_graphs_grows_the_eager_trees():
    assert_holds(check_captured_draft(CUDA, "fp8"))


def test_a_captured_draft_looking_its_rows_up_on_the_host_grows_the_eager_trees():
    assert_holds(check_captured_draft(CUDA, "fp8", hosted=True))


def test_dsi_thread_workers_beside_the_captured_draft_step_give_the_target_tokens():
    assert_holds(check_dsi_captured(CUDA))


def test_draft_captures_beside_the_streamers_loads_all_replay_their_step():
    assert_holds(check_capture_beside_loads(CUDA))


@pytest.mark.parametrize("kind", ["none", "int4", "fp8"])
def test_the_draft_step_probe_times_each_form_captured(kind):
    """doctor and auto's step costs: each form's probe layers captured in a CUDA graph and
    replayed at one token and at a tree step's width (a capture that failed would raise here)."""
    if kind == "fp8" and not fp8_runs_on(CUDA):
        pytest.skip("fp8 products need compute capability 8.9")
    one_s, wide_s = measure_step(wide_config(), DraftQuant(kind), torch.bfloat16, CUDA, 86)
    assert 0 < one_s and 0 < wide_s


@pytest.mark.skipif(not torch.cuda.is_available() or not fp8_runs_on(CUDA), reason="no fp8 units on this GPU")
def test_the_fused_fp8_row_kernel_quantizes_as_torchs_kernels_do_bit_for_bit():
    """On the GPU (the CPU suite compares them under Triton's interpreter): a step's rows, at a
    Llama-3-8B's widths, with a pad row of zeros."""
    generator = torch.Generator(device=CUDA).manual_seed(0)
    for cols in (4096, 14336):
        rows = torch.randn(256, cols, generator=generator, device=CUDA, dtype=torch.bfloat16)
        rows[7] *= 3e3
        rows[255] = 0.0
        quantized, scale = quantize_rows_fused(rows, TINY, INVERSE_MAX, FP8_MAX)
        expected, expected_scale = quantize_rows(rows)
        assert torch.equal(quantized.view(torch.uint8), expected.view(torch.uint8))
        assert torch.equal(scale, expected_scale)


def test_pinned_bytes_pulled_by_the_device_arrive_whole_beside_the_streamers_loads():
    """host_pull's kernel reads pinned memory over the link (the CPU suite runs it under Triton's
    interpreter): a sender's lineages and a bucket's ids and rows, its staging growing then reused,
    arrive as the host holds them while a loader thread keeps the copy engine busy with 64 MB copies."""
    mover = CudaMover([torch.empty(64 << 20, dtype=torch.uint8, device=CUDA) for _ in range(2)])
    layer = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8).pin_memory()
    stop = threading.Event()

    def load() -> None:
        slot = 0
        while not stop.is_set():
            mover.wait_free(slot)
            mover.issue(slot, layer)
            mover.settle(slot)
            slot = 1 - slot

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    sender, generator = HostSender(CUDA), torch.Generator().manual_seed(0)
    try:
        for count in (3, 300, 40, 1000):
            lineages = torch.randint(0, 1 << 40, (count, 24), generator=generator)
            assert torch.equal(sender.send(lineages).cpu(), lineages)
            rows = torch.randn(count, 4096, generator=generator).to(torch.bfloat16).pin_memory()
            out = torch.empty_like(rows, device=CUDA)
            pull(out, rows)
            assert torch.equal(out.cpu(), rows)
    finally:
        stop.set()
        loader.join()


def cudnn_kernels_of(run) -> list[str]:
    """The device kernels `run` launched whose names say cuDNN."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        run()
        torch.cuda.synchronize()
    return [event.name for event in profile.events() if "cudnn" in event.name.lower()]


@pytest.mark.parametrize("interface", [bounded_sdpa, grouped_sdpa])
def test_a_tree_pass_whose_keys_grow_runs_no_cudnn_attention(interface):
    """Each pass of an offloaded target meets a new key count, for which cuDNN's SDPA built a plan on
    the host (39-57 ms a pass of the 70B on the H200): outside repeating_shapes its attention runs a
    kernel that builds none (within it, captured draft steps: the captured checks above). The same
    calls within repeating_shapes run cuDNN on an H200, so the check can fail there."""
    generator = torch.Generator(device=CUDA).manual_seed(0)
    groups, heads = 8, 64  # a 70B target's attention: 64 query heads on 8 KV heads
    module = SimpleNamespace(num_key_value_groups=groups, is_causal=False, training=False)

    def inputs(keys: int) -> tuple[torch.Tensor, ...]:
        query = torch.randn(1, heads, 256, 128, generator=generator, device=CUDA, dtype=torch.bfloat16)
        key, value = (torch.randn(1, heads // groups, keys, 128, generator=generator, device=CUDA,
                                  dtype=torch.bfloat16) for _ in range(2))
        mask = torch.ones(1, 1, 256, keys, dtype=torch.bool, device=CUDA).tril(keys - 256)
        return query, key, value, mask

    def tree_pass(keys: int) -> None:
        interface(module, *inputs(keys))

    def repeating_tree_pass(keys: int) -> None:
        with repeating_shapes():
            tree_pass(keys)

    assert cudnn_kernels_of(lambda: [repeating_tree_pass(keys) for keys in (1000, 1001, 1002)])
    assert not cudnn_kernels_of(lambda: [tree_pass(keys) for keys in (1000, 1001, 1002)])
