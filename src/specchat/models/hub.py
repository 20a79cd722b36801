"""Fetching a model from the Hugging Face Hub (or its local cache), with errors a user can act on."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
from tqdm.auto import tqdm

from specchat.errors import SpecchatError
from specchat.models.spec import offline_message

# Weights as safetensors only: many repos also carry pickled .bin copies (twice the download, and
# unpickling runs code); "*.json" also brings config, generation config and tokenizer files.
_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


class _SilentTqdm(tqdm):
    """snapshot_download's bar, switched off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "disable": True})


def download(repo_id: str, progress: bool) -> Path:
    """The local snapshot directory of `repo_id`, downloading what is missing."""
    with user_errors(repo_id):
        snapshot = snapshot_download(repo_id, allow_patterns=_PATTERNS, tqdm_class=None if progress else _SilentTqdm)
    path = Path(snapshot)
    if not any(path.glob("*.safetensors")):
        raise SpecchatError(f"{repo_id} has no .safetensors weights; specchat does not load pickled .bin weights")
    return path


def download_config(repo_id: str) -> Path:
    """`repo_id`'s config.json alone (a few KB), so that a plan can refuse before the weights come."""
    with user_errors(repo_id):
        return Path(hf_hub_download(repo_id, "config.json"))


@contextmanager
def user_errors(repo_id: str) -> Iterator[None]:
    """The Hub's failures as one line a user can act on."""
    try:
        yield
    except GatedRepoError as error:
        raise SpecchatError(
            f"{repo_id} is gated: accept its license on https://huggingface.co/{repo_id}, then run `hf auth login`"
        ) from error
    except RepositoryNotFoundError as error:
        raise SpecchatError(f"{repo_id} was not found on the Hugging Face Hub (private? run `hf auth login`)") from error
    except LocalEntryNotFoundError as error:  # offline, or the Hub unreachable, and not (fully) cached
        raise SpecchatError(offline_message(repo_id)) from error
