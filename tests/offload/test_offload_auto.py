"""--offload auto (issue 16, acceptance 2 on tiny models): under --ram-budget values forcing each
split (all resident; part in RAM, part on disk; all on disk) the target gives the in-memory logits
and greedy tokens, and the chosen placement is the one the budget forces. Acceptance 4's errors:
each is one line, leaves no partial file and no open descriptor. The budgets are a CPU host's
(--ram-budget binds the device the layers run on), so the module runs as on one wherever it runs;
the GPU's tiers have tests of their own (tests/scripts/test_gpu_checks_on_cuda.py)."""

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.cli import CORPUS, train_tokenizer
from helpers.descriptors import held_descriptors, open_descriptors
from helpers.tiny import tiny_qwen_config
from transformers import Qwen2ForCausalLM

from specchat.decoding.events import LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.engine_options import EngineOptions
from specchat.errors import SpecchatError
from specchat.limits import auto_cap
from specchat.loader import load_models, plan_run
from specchat.plan import resolve_weights
from specchat.progress import Reporter
from specchat.runtime import Models

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, seed=0)
LAYERS = 6
PROMPT = [5, 9, 2, 33, 17, 4, 8]


def save_model(directory: Path, layers: int, seed: int) -> Path:
    tokenizer = train_tokenizer(CORPUS)
    torch.manual_seed(seed)
    config = tiny_qwen_config(vocab_size=len(tokenizer), num_hidden_layers=layers, max_position_embeddings=512,
                              eos_token_id=tokenizer.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", autouse=True)
def cpu_host() -> Iterator[None]:
    """A CPU host: torch reports no GPU, so specchat picks the CPU, plans RAM as its device and
    pins no staging buffers. Module-wide, as the module's models are loaded once for its tests."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        yield


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("auto")
    return save_model(root / "target", LAYERS, seed=4), save_model(root / "draft", 2, seed=5)


def options(pair, tmp_path: Path, **changes) -> EngineOptions:
    target, draft = pair
    return EngineOptions(target=str(target), draft=str(draft), dtype="float32", draft_quant="none",
                         offload_dir=str(tmp_path / "offload"), **changes)


def budgets(pair, tmp_path: Path) -> dict[str, float]:
    """RAM budgets (GB) that force each split, from the plan's own sizes: half a layer past
    each threshold, so no rounding decides the split."""
    run = options(pair, tmp_path, offload="auto")  # the run's own plan: the draft and both caches counted
    cpu = torch.device("cpu")
    whole = plan_run(resolve_weights(run), cpu, True, Reporter(bars=False)).placement
    layer, slot = whole.layers[0], whole.slot_bytes
    reserved = whole.needed - sum(whole.layers)
    return {
        "resident": (whole.needed + layer // 2) / 1e9,
        "split": (reserved + 2 * slot + 3 * layer + layer // 2) / 1e9,
        "disk": (reserved + 2 * slot + layer // 2) / 1e9,
        "short": (reserved + 2 * slot - 4096) / 1e9,  # a page short of the smallest ring
    }


def logits(lm: CausalLM) -> torch.Tensor:
    """Sequential greedy rows, then a second chunk fed at once (the tree pass's shape)."""
    cache, rows, tokens = new_cache(), [], torch.tensor(PROMPT)
    for step in range(4):
        start = len(PROMPT) + step - tokens.numel()
        rows.append(lm.logits(lm.hidden(tokens, torch.arange(start, start + tokens.numel()), cache)[-1:])[0])
        tokens = rows[-1].argmax().view(1)
    return torch.stack(rows)


def greedy_tokens(models: Models) -> list[int]:
    engine = models.engine("specexec", LiveSettings(budget=6, depth=4))
    return [t for e in engine.generate(PROMPT, 12, GREEDY) for t in e.token_ids]


@pytest.fixture(scope="module")
def reference(pair, tmp_path_factory):
    models = load_models(options(pair, tmp_path_factory.mktemp("ref"), offload="none"), progress=False)
    try:
        return logits(models.target), greedy_tokens(models)
    finally:
        models.close()


@pytest.mark.parametrize("split, expected", [("resident", (LAYERS, 0, 0)), ("split", (3, 0, 3)), ("disk", (0, 0, 6))])
def test_auto_under_a_ram_budget_places_as_forced_and_computes_as_in_memory(pair, reference, tmp_path, split,
                                                                              expected):
    sizes = budgets(pair, tmp_path)
    models = load_models(options(pair, tmp_path, offload="auto", ram_budget=sizes[split]), progress=False)
    try:
        placement = models.placement
        assert (placement.resident, placement.ram, placement.disk) == expected
        assert (models.offload is None) == (split == "resident")  # all resident: loaded as with none
        # the cost probe's key: all resident costs what none costs; a streaming placement is part of it,
        # marked where its resident layers are spread among the streamed (costs of their own)
        assert models.identity["offload"] == ("none" if split == "resident" else "auto")
        spread = ["spread"] if split == "split" else []
        assert models.identity.get("placement") == (None if split == "resident" else [*expected, 2, *spread])
        if models.offload is not None:
            assert models.offload.streamed == placement.streamed and placement.slots == 2
        torch.testing.assert_close(logits(models.target), reference[0], atol=1e-5, rtol=0)
        assert greedy_tokens(models) == reference[1]
        if split == "disk":
            assert models.offload.stats().bytes > 0
    finally:
        models.close()


def test_an_explicit_disk_tier_without_a_budget_stages_a_whole_pass(pair, tmp_path):
    models = load_models(options(pair, tmp_path, offload="disk", resident_layers=1), progress=False)
    try:
        assert models.placement.slots == LAYERS - 1 and models.offload.streamer.stages_a_pass
        events = list(models.engine("specexec", LiveSettings(budget=6)).generate(PROMPT, 6, GREEDY))
        assert all(e.link_idle == 0.0 for e in events)  # nothing is ever left to move
    finally:
        models.close()


def test_a_ram_budget_too_small_for_the_ring_is_one_line_before_anything_is_written(pair, tmp_path):
    sizes = budgets(pair, tmp_path)
    tight = sizes["short"]
    before = held_descriptors()
    with pytest.raises(SpecchatError) as raised:  # a --budget of auto's cap: the plan may not shrink the tree
        load_models(options(pair, tmp_path, offload="auto", budget=auto_cap(cuda=False, offloaded=True),
                            ram_budget=tight), progress=False)
    message = str(raised.value)
    assert re.search(r"under --ram-budget [\d.]+ GB is [\d.]+ GB short: [\d.]+ GB are needed for the smallest "
                     r"streaming ring beside ", message) and "\n" not in message
    assert re.search(r"; --context \d+ would fit$", message)  # a page short: a few tokens less of KV fit
    assert message.startswith(f"RAM under --ram-budget {tight:g} GB")
    assert not (tmp_path / "offload").exists() and open_descriptors() == before


def test_a_truncated_layer_file_is_written_again(pair, tmp_path):
    models = load_models(options(pair, tmp_path, offload="disk", resident_layers=0), progress=False)
    path = models.offload.store.path
    models.close()
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 4096)
    models = load_models(options(pair, tmp_path, offload="disk", resident_layers=0), progress=False)
    try:
        assert path.stat().st_size == models.offload.store.file_bytes
        assert greedy_tokens(models)  # reads every layer whole
    finally:
        models.close()


def test_a_layer_file_truncated_while_running_is_one_line_and_closes_everything(pair, tmp_path):
    before = held_descriptors()
    models = load_models(options(pair, tmp_path, offload="disk", resident_layers=0), progress=False)
    models.offload.streamer.drain()
    with open(models.offload.store.path, "r+b") as handle:
        handle.truncate(4096)
    with pytest.raises(SpecchatError, match=r"^short read from .*\.layers: \d+ of \d+ bytes at offset \d+ "
                                            r"\(the file is truncated\)$"):
        greedy_tokens(models)
    models.close()
    assert open_descriptors() == before


def test_an_unreadable_layer_file_is_one_line_and_closes_everything(pair, tmp_path, monkeypatch):
    import errno

    before = held_descriptors()
    models = load_models(options(pair, tmp_path, offload="disk", resident_layers=0), progress=False)
    models.offload.streamer.drain()

    def failing(fd, views, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(SpecchatError, match=r"^cannot read .*\.layers: Input/output error$"):
        greedy_tokens(models)
    monkeypatch.undo()
    models.close()
    assert open_descriptors() == before
