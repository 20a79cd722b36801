"""The suite's shared fixtures and hooks, loaded as a plugin by tests/conftest.py in every process
that runs tests (tests take them by name): tiny random models, the real pair, the order xdist's
workers take the modules in, and what keeps the suite from leaving anything behind: a private
history dir for every test, a temporary offload dir and Triton cache, and time limits."""

import gc
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.exactness import ExactnessCheck, hf_greedy
from helpers.ram_turns import RAM_ENV, REAL_MODULE_RAM, RamTurns, give_back, slot_count
from helpers.real_pair import GREEDY_NEW_TOKENS, GREEDY_PROMPTS, PAPER_SAMPLING, RealPair, load_real_pair
from helpers.run_dirs import make_run_dir
from helpers.shared_tokens import References, SharedTokens
from helpers.tiny import build_tiny, perturbed

from specchat.bench.datasets import mtbench_first_turns
from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.forward import CausalLM
from specchat.heap_trim import release_free_heap
from specchat.paths import cache_dir

REAL_TIMEOUT_S = 1800  # a `real` test may convert both embedded models and write a layer file first


def cores_per_worker() -> int:
    """This process's share of the cores: all of them outside xdist, else an equal part."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


REAL_MODULES = pytest.StashKey[set[Path]]()  # the test files holding a real test


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules with real tests first, then those marked slow, so that xdist's workers, which take
    a module at a time in this order, spend the run's tail on the many short ones; a stable sort keeps
    each module's tests together and in order. A real module reserves REAL_MODULE_RAM for its run
    (ram_turn).
    pytest-timeout: the real tests get a longer limit than [tool.pytest.ini_options] timeout,
    unless they set their own."""
    real = {item.path for item in items if item.get_closest_marker("real")}
    config.stash[REAL_MODULES] = real
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in real, item.path not in slow))
    for item in items:
        if item.get_closest_marker("real") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(REAL_TIMEOUT_S))


@pytest.fixture(scope="module", autouse=True)
def ram_turn(request, tmp_path_factory) -> Iterator[None]:
    """Under xdist, a module with real tests waits for a slot at the RAM (tests/helpers/ram_turns.py);
    after its teardown this worker returns the freed heap to the OS before giving the slot back."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or request.node.path not in request.config.stash[REAL_MODULES]:
        yield
        return
    slots = slot_count(int(os.environ[RAM_ENV]), REAL_MODULE_RAM)
    slot = RamTurns(tmp_path_factory.getbasetemp().parent, slots, int(worker.removeprefix("gw"))).take()
    yield
    gc.collect()
    release_free_heap()
    give_back(slot)


@pytest.fixture(scope="session", autouse=True)
def session_probe_dir(tmp_path_factory) -> Iterator[Path]:
    """One directory of machine measurements for the whole run, set before any fixture of a wider
    scope loads models: a --budget auto probe (~26 s for the default pair on the AMX Xeon) or a
    startup choice (machine_choices.py) made once is reused, under xdist by every worker (the
    folder beside the workers' temporary folders: their facts are alike, one torch thread each;
    the files are written atomically, so a worker reads a whole file or probes itself)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        directory = tmp_path_factory.getbasetemp().parent / "probes"
        directory.mkdir(exist_ok=True)
    else:
        directory = tmp_path_factory.mktemp("probes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECCHAT_PROBE_DIR", str(directory))
        yield directory


@pytest.fixture(scope="session", autouse=True)
def private_triton_cache(tmp_path_factory) -> Iterator[None]:
    """Kernels Triton compiles for a GPU here (tests/helpers/gemm_compile.py) go to the run's
    temporary folder, not the user's ~/.triton (the variable reaches the checks run as subprocesses)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton")))
        yield


@pytest.fixture(autouse=True)
def private_data_dir(tmp_path_factory, session_probe_dir, monkeypatch) -> None:
    """No test reads or writes the user's history or the machine's measurements: SPECCHAT_DATA_DIR
    and SPECCHAT_PROBE_DIR point at temporary directories (subprocesses inherit them)."""
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(session_probe_dir))


@pytest.fixture(scope="session")
def offload_dir() -> Iterator[Path]:
    """Where tests write offload layer files, removed after the session. It sits beside the user
    cache, where the app writes its own layer file, because /tmp may be a tmpfs: in RAM, and
    without the O_DIRECT reads the disk tier is tested for. A killed run's directory is removed
    by the next run."""
    directory = make_run_dir(cache_dir(), "test-offload-")
    yield directory
    shutil.rmtree(directory)


@pytest.fixture(scope="session", autouse=True)
def worker_threads() -> Iterator[None]:
    """Under xdist, this worker's torch and its `specchat` subprocesses take the worker's share of
    the cores, before any model loads (the draft's int8 probe times what the tests will run): with
    a thread on a core another worker is using, OpenMP's spin-waits stall every parallel region."""
    if "PYTEST_XDIST_WORKER_COUNT" not in os.environ:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(cores_per_worker())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", str(cores_per_worker()))
        yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def one_thread_unless_real(request):
    """Tiny models gain nothing from intra-op threads, and OpenMP spin-waiting makes them ~10x
    slower whenever the other core is busy; tests of the real pair keep every thread this process
    has (under xdist, its worker's share: worker_threads)."""
    if request.node.get_closest_marker("real"):
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_target() -> CausalLM:
    return build_tiny(0)


@pytest.fixture(scope="session")
def tiny_draft(tiny_target) -> CausalLM:
    return perturbed(tiny_target, 0.3, seed=1)


@pytest.fixture(scope="module")
def real_pair() -> Iterator[RealPair]:
    """Loaded per test module and released after it, so that a module loading models of its own
    (the app's, offloaded copies, float32 subprocesses) never holds two pairs at once. Held for the
    whole run instead (~15 s a load saved in each of eight modules), the suite reached 23.5 of this
    machine's 23.5 GB while the serve test's two float32 processes ran beside it."""
    pair = load_real_pair()
    yield pair
    del pair
    gc.collect()
    release_free_heap()


@pytest.fixture(scope="session")
def reference_tokens(tmp_path_factory) -> SharedTokens:
    """The target's own outputs, kept across modules by kind: computed once a run, whichever module
    asks first (the models that computed them are released with their module), under xdist in the
    folder beside the workers' temporary folders that all of them share (tests/helpers/shared_tokens.py)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return SharedTokens(tmp_path_factory.getbasetemp().parent / "references")
    return SharedTokens(tmp_path_factory.mktemp("references"))


@pytest.fixture(scope="session")
def mtbench_prompts() -> list[str]:
    return mtbench_first_turns(5)


@pytest.fixture(scope="session")
def rough_draft(tiny_target) -> CausalLM:
    """A draft that often disagrees with the target, so rejections and residuals are common."""
    return perturbed(tiny_target, 1.0, seed=2)


@pytest.fixture(scope="module")
def seeded_references(real_pair, mtbench_prompts, reference_tokens) -> References:
    """(prompt ids, seeded autoregressive ids at the paper's t=0.6, p=0.9) for the first
    MT-Bench prompts: every lossless engine must emit exactly these."""
    def compute() -> References:
        autoregressive = AutoregressiveEngine(real_pair.target, real_pair.stop_ids)
        references = []
        for prompt in mtbench_prompts[:GREEDY_PROMPTS]:
            prompt_ids = real_pair.chat(prompt)
            events = autoregressive.generate(prompt_ids, GREEDY_NEW_TOKENS, PAPER_SAMPLING)
            references.append((prompt_ids, [t for e in events for t in e.token_ids]))
        return references
    return reference_tokens.get("seeded", compute)


@pytest.fixture(scope="module")
def real_check(real_pair) -> ExactnessCheck:
    """The tightened comparison (tests/helpers/exactness.py) for the suite's reduced exactness runs."""
    return ExactnessCheck(real_pair.target, real_pair.stop_ids, GREEDY_NEW_TOKENS)


@pytest.fixture(scope="module")
def greedy_references(real_pair, mtbench_prompts, reference_tokens) -> References:
    """(prompt ids, HF `generate(do_sample=False)` ids) for the first MT-Bench prompts."""
    def compute() -> References:
        prompts = [real_pair.chat(p) for p in mtbench_prompts[:GREEDY_PROMPTS]]
        pad = real_pair.tokenizer.pad_token_id
        return [(ids, hf_greedy(real_pair.target, ids, GREEDY_NEW_TOKENS, real_pair.stop_ids, pad)) for ids in prompts]
    return reference_tokens.get("greedy", compute)
