"""Where specchat keeps its files (platformdirs), overridable via SPECCHAT_CACHE_DIR, and where it
keeps what it measured of this machine, overridable apart via SPECCHAT_PROBE_DIR (the tests point
it at a temporary directory while they keep using the converted models in the cache)."""

import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_dir() -> Path:
    """Root of the model cache (assembled GGUF files and converted safetensors)."""
    override = os.environ.get("SPECCHAT_CACHE_DIR")
    return Path(override) if override else Path(user_cache_dir("specchat"))


def offload_dir() -> Path:
    """Where the disk tier's layer files go unless --offload-dir says otherwise."""
    return cache_dir() / "offload"


def probe_dir() -> Path:
    """Measurements of this machine: --budget auto's costs, doctor's link speeds."""
    override = os.environ.get("SPECCHAT_PROBE_DIR")
    return Path(override) if override else cache_dir() / "probes"
