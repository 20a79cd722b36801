"""A checkpoint's tensor names as the model built by transformers 5 names its modules.

Some families' checkpoints name modules the model no longer has: a Mixtral checkpoint keeps each
MoE block under `block_sparse_moe` and each expert's linears as w1 (gate), w3 (up) and w2 (down),
where transformers 5 builds `mlp` (and renames at its own load, in its conversion mapping). A
GPTQ checkpoint's per-expert linears are read into quant/split_experts.py's `experts.E.gate_proj`,
`up_proj` and `down_proj`. Families whose checkpoints already use the model's names (Qwen3-MoE)
need no entry.
"""

import json
import re
from collections.abc import Iterable
from pathlib import Path

from specchat.errors import SpecchatError

RENAMES: dict[str, tuple[tuple[re.Pattern, str], ...]] = {
    "mixtral": (
        (re.compile(r"\.block_sparse_moe\.(experts|gate)\."), r".mlp.\1."),
        (re.compile(r"(\.experts\.\d+)\.w1\."), r"\1.gate_proj."),
        (re.compile(r"(\.experts\.\d+)\.w3\."), r"\1.up_proj."),
        (re.compile(r"(\.experts\.\d+)\.w2\."), r"\1.down_proj."),
    ),
}


def model_type(directory: Path) -> str | None:
    """The model_type its config.json declares; None for a directory without one."""
    config = directory / "config.json"
    return json.loads(config.read_text()).get("model_type") if config.is_file() else None


def model_names(family: str | None, names: Iterable[str]) -> dict[str, str]:
    """{the model's name: the checkpoint's name} for each of a `family` checkpoint's tensor names;
    one line where two of them would name the same tensor."""
    renames = RENAMES.get(family, ())
    mapped: dict[str, str] = {}
    for name in names:
        renamed = name
        for pattern, replacement in renames:
            renamed = pattern.sub(replacement, renamed)
        if renamed in mapped:
            raise SpecchatError(f"the checkpoint holds both {mapped[renamed]!r} and {name!r}, which name one tensor")
        mapped[renamed] = name
    return mapped
