"""Where specchat keeps its files (platformdirs), overridable for tests via SPECCHAT_CACHE_DIR."""

import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_dir() -> Path:
    """Root of the model cache (assembled GGUF files and converted safetensors)."""
    override = os.environ.get("SPECCHAT_CACHE_DIR")
    return Path(override) if override else Path(user_cache_dir("specchat"))
