"""The suite's entry: how many xdist workers run it, and its fixtures and hooks
(tests/helpers/fixtures.py), loaded in every process that runs tests. xdist's controller runs
none, so it does not import them, nor transformers with them: it starts its workers ~5 s sooner.
It imports torch only to time the product that sizes the real tests (tests/helpers/suite_scale.py)."""

import os

import pytest
from helpers.ram_turns import RAM_ENV, RAM_MARGIN, REAL_MODULE_RAM
from helpers.suite_scale import Scale, decide_scale

from specchat.memory_room import ram_room


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): one worker per core, as many as the RAM this process may
    take holds REAL_MODULE_RAM each; 0 (the suite runs in this process) where one would be all. Each
    worker's torch then runs one thread per core it was given (worker_threads): measured
    here, two one-thread processes each score a float32 target pass as fast as one alone, where
    a second thread in one process gains 1.0-1.5x."""
    workers = min(os.cpu_count() or 1, (ram_room().bytes - RAM_MARGIN) // REAL_MODULE_RAM)
    return workers if workers > 1 else 0


SCALE = pytest.StashKey[Scale]()


@pytest.hookimpl(trylast=True)  # after xdist's own, which registers the controller's session
def pytest_configure(config: pytest.Config) -> None:
    """The controller measures the RAM and the real tests' scale (tests/helpers/suite_scale.py)
    once, before it starts the workers that inherit them; a process that runs tests (a worker, or
    the only process) loads the fixtures, as does one that lists them (`--fixtures`,
    `--fixtures-per-test` collect in the controller)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault(RAM_ENV, str(ram_room().bytes - RAM_MARGIN))
        config.stash[SCALE] = decide_scale()
    lists = config.getoption("showfixtures") or config.getoption("show_fixtures_per_test")
    if lists or not config.pluginmanager.has_plugin("dsession"):
        config.pluginmanager.import_plugin("helpers.fixtures")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The run's scale after its results, `-q` or not (the controller's, or the only process's)."""
    scale = config.stash.get(SCALE, None)
    if scale is not None:
        terminalreporter.write_line(scale.describe())
