"""Count the ops a draft's step dispatches per decoder layer: as transformers builds the draft, and
as specchat prepares a draft for CUDA (q/k/v and gate/up stacked, norms fused: models/draft_approx.py).

Usage: python scripts/count_draft_ops.py [--alias llama-3.1-8b-awq] [--rows 16]

A captured step on a GPU is bound by its kernels' count (each a few microseconds however few its
rows), and nearly every op here is one kernel there (a linear's product, the fused rms_norm, the
attention), so the count is measured on any device, the CPU included: the alias's layer shrunk
(hidden 512 in 8 heads, its heads a KV head kept; the ops do not depend on widths), the step at a bucket's static shapes
(decoding/static_step.py), the ops dispatched below autograd counted by a TorchDispatchMode, views
and allocations left out. Ops a layer: a 2-layer model's count less a 1-layer one's. Prints a
Markdown table: the ops a layer and outside the layers, and each op's count a layer.
"""

import argparse
import json
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.static_step import static_draft
from specchat.models.configs import shipped_config_path
from specchat.models.draft_approx import DraftApprox

SHRINK = {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "vocab_size": 512,
          "bos_token_id": 0, "eos_token_id": 0}
UNCOUNTED = {"empty", "empty_strided", "_local_scalar_dense", "lift_fresh", "detach"}  # no kernel
PROMPT = 8


class DispatchedOps(TorchDispatchMode):
    """The names of the ops dispatched inside it that compute: not views (an output in an input's
    storage; `to` is one where it converts nothing), not allocations."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        may_alias = any(ret.alias_info is not None and not ret.alias_info.is_write for ret in func._schema.returns)
        if name not in UNCOUNTED and not (may_alias and viewed(out, args)):
            self.ops[name] += 1
        return out


def viewed(out: object, args: tuple) -> bool:
    """Whether `out` lies in the storage of a tensor among `args`."""
    if not isinstance(out, torch.Tensor):
        return True
    storages = {arg.untyped_storage().data_ptr() for arg in args if isinstance(arg, torch.Tensor)}
    return out.untyped_storage().data_ptr() in storages


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alias", default="llama-3.1-8b-awq", help="a shipped alias's config (models/configs/)")
    parser.add_argument("--rows", type=int, default=16, help="tree rows the step adds (a bucket's width)")
    return parser.parse_args()


def shrunk_model(alias: str, layers: int, prepared: bool) -> PreTrainedModel:
    values = json.loads(shipped_config_path(alias).read_text())
    values.pop("quantization_config", None)
    # the alias's heads a KV head (grouped attention copies its keys and values for a masked step's
    # attention: one KV head would make that copy a view)
    grouped = values["num_attention_heads"] // values.get("num_key_value_heads", values["num_attention_heads"])
    values |= SHRINK | {"num_hidden_layers": layers, "num_key_value_heads": SHRINK["num_attention_heads"] // grouped}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values), dtype=torch.bfloat16,
                                             attn_implementation="sdpa").eval()
    if prepared:  # as for CUDA; the preparation reads the run's device, not where the weights are
        approx = DraftApprox(False, None, device=torch.device("cuda"))
        for layer in model.model.layers:
            approx.prepare_layer(layer)
        approx.draft(model)
    return model


def step_ops(alias: str, layers: int, prepared: bool, rows: int) -> Counter[str]:
    """The ops of one static-shape step of `rows` rows after a prompt."""
    draft = static_draft(CausalLM(shrunk_model(alias, layers, prepared)), PROMPT + 2 * rows + 256, capture=False)
    cache = new_cache()
    draft.hidden(torch.arange(PROMPT), torch.arange(PROMPT), cache)
    draft.hidden(torch.arange(rows), torch.arange(PROMPT, PROMPT + rows), cache)  # buffers made
    with DispatchedOps() as counted:
        draft.hidden(torch.arange(rows), torch.arange(PROMPT + rows, PROMPT + 2 * rows), cache)
    return counted.ops


def main() -> None:
    args = parse_args()
    print(f"| {args.alias}, a step of {args.rows} rows | ops a layer | outside the layers | each op a layer |")
    print("|---|---|---|---|")
    for prepared in (False, True):
        one, two = (step_ops(args.alias, layers, prepared, args.rows) for layers in (1, 2))
        layer = two - one
        each = ", ".join(f"{name} {count}" for name, count in sorted(layer.items()))
        form = "prepared for CUDA (stacked, norms fused)" if prepared else "as transformers builds it"
        print(f"| {form} | {layer.total()} | {one.total() - layer.total()} | {each} |")


if __name__ == "__main__":
    main()
