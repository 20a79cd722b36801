"""Where specchat keeps its files (platformdirs), overridable via SPECCHAT_CACHE_DIR, and where it
keeps what it measured of this machine, overridable apart via SPECCHAT_PROBE_DIR (the tests point
it at a temporary directory while they keep using the converted models in the cache)."""

import os
from pathlib import Path

from platformdirs import user_cache_dir

from specchat.errors import SpecchatError


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


def expanded(path: str | Path, named_by: str) -> Path:
    """`path` with a leading ~ or ~user made that home; SpecchatError "`named_by` PATH: why" where
    no home is known for it (Path.expanduser raises RuntimeError: ~0, or ~ without HOME)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        home = str(path).split("/", 1)[0]
        raise SpecchatError(f"{named_by} {path}: no home directory is known for '{home}'") from None


def output_path(flag: str, text: str) -> Path:
    """The directory `flag` names, ~ expanded; one line where it is blank (an unset shell variable,
    `--out "$DIR"`, would otherwise write into the current directory unsaid)."""
    if not text.strip():
        raise SpecchatError(f"{flag} is empty: name a directory ('.' for the current one)")
    return expanded(text, flag)


def make_output_dir(flag: str, directory: Path) -> None:
    """Make `directory`, which `flag` names for writing, before anything slow runs: one line where it
    is a file, cannot be made or cannot be written (a bench would find out after loading its models)."""
    if directory.exists() and not directory.is_dir():
        raise SpecchatError(f"{flag} {directory} is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecchatError(f"{flag} {directory}: cannot create it: {error.strerror}") from error
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SpecchatError(f"{flag} {directory}: cannot write there")
