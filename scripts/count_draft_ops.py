"""Count the ops a draft's step dispatches per decoder layer, and the bytes they write: as
transformers builds the draft, and as specchat prepares a draft for CUDA (q/k/v and gate/up
stacked, norms fused, grouped attention without copied keys and values: models/draft_approx.py).

Usage: python scripts/count_draft_ops.py [--alias llama-3.1-8b-awq] [--rows 16] [--cached 8] [--capacity 6400]
       [--shrunk]

A captured step on a GPU is bound by its kernels' count (each a few microseconds however few its
rows) and the bytes they move, and nearly every op here is one kernel there (a linear's product,
the fused rms_norm, the attention), so both are measured on any device, the CPU included: the
alias's decoder layers at its widths (`--shrunk`: hidden 512 in 8 heads, its query heads a KV head
kept, for a quick count: the ops do not depend on widths, the bytes do), random weights, one step
of `--rows` rows at a bucket's static shapes (decoding/static_step.py) after `--cached` tokens, in
a cache reserved for `--capacity` slots (the default: a 4096-token context, a 2048-node tree and a
bucket of pads, as the loader reserves), attending over the span that holds them (the capacity
where it is shorter), the ops dispatched below autograd counted by a TorchDispatchMode, views and
allocations left out; the bytes are those of each out-of-place op's output (an in-place op writes
a few rows of a buffer). A layer's: a 2-layer model's less a 1-layer one's. Prints a Markdown
table: ops and MB written a layer, ops outside the layers, and each op's count a layer.
"""

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, PreTrainedModel

from specchat.bounded_attention import bound_attention
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.static_step import BUCKETS, LEAST_SPAN, bucket_for, span_for, static_draft
from specchat.models.draft_approx import DraftApprox

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the GPU checks' config helpers
from gpu_checks.scale_models import alias_config  # noqa: E402

SHRINK = {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8}
SMALL_VOCAB = {"vocab_size": 512, "bos_token_id": 0, "eos_token_id": 0}  # the head is outside the layers
UNCOUNTED = {"empty", "new_empty", "empty_strided", "_local_scalar_dense", "lift_fresh", "detach"}  # no kernel


class DispatchedOps(TorchDispatchMode):
    """The names of the ops dispatched inside it that compute, and the bytes the out-of-place ones
    write: not views (an output in an input's storage; `to` is one where it converts nothing), not
    allocations."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        may_alias = any(ret.alias_info is not None and not ret.alias_info.is_write for ret in func._schema.returns)
        if name not in UNCOUNTED and not (may_alias and viewed(out, args)):
            self.ops[name] += 1
            if isinstance(out, torch.Tensor) and not name.endswith("_"):
                self.written += out.nbytes
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
    parser.add_argument("--cached", type=int, default=8, help="tokens in the cache before the steps")
    parser.add_argument("--capacity", type=int, default=4096 + 2048 + 256, help="cache slots reserved")
    parser.add_argument("--shrunk", action="store_true", help="narrow layers: the same ops, fewer bytes, quicker")
    args = parser.parse_args()
    if bucket_for(args.rows) is None or args.rows < 1:
        parser.error(f"--rows {args.rows}: a static step takes 1 to {BUCKETS[-1]} rows")
    if args.cached < 1:
        parser.error(f"--cached {args.cached}: a static step follows at least one cached token")
    if args.capacity < args.cached + 2 * args.rows + 256:
        parser.error(f"--capacity {args.capacity}: a step of {args.rows} rows after {args.cached} needs "
                     f"{args.cached + 2 * args.rows + 256}")
    return args


def built_model(alias: str, layers: int, prepared: bool, shrunk: bool) -> PreTrainedModel:
    shrink = dict(SMALL_VOCAB)
    if shrunk:  # its query heads a KV head kept: grouped attention copies keys and values (one KV head: a view)
        shipped, _ = alias_config(alias, layers, {})
        grouped = shipped.num_attention_heads // shipped.num_key_value_heads
        shrink |= SHRINK | {"num_key_value_heads": SHRINK["num_attention_heads"] // grouped}
    config, _ = alias_config(alias, layers, shrink)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    if prepared:  # as the app builds it, prepared for CUDA (the preparation reads the run's device)
        bound_attention(model)
        DraftApprox(False, None, device=torch.device("cuda")).prepared(model)
    return model


def step_ops(args: argparse.Namespace, layers: int, prepared: bool) -> DispatchedOps:
    """The ops of one static-shape step of args.rows rows after args.cached tokens and a step
    of as many rows (which made the buffers)."""
    model = built_model(args.alias, layers, prepared, args.shrunk)
    draft = static_draft(CausalLM(model), args.capacity, capture=False)
    cache, cached, rows = new_cache(), args.cached, args.rows
    tokens = torch.arange(cached + 2 * rows) % model.config.vocab_size
    draft.hidden(tokens[:cached], torch.arange(cached), cache)
    draft.hidden(tokens[cached:cached + rows], torch.arange(cached, cached + rows), cache)
    with DispatchedOps() as counted:
        draft.hidden(tokens[cached + rows:], torch.arange(cached + rows, cached + 2 * rows), cache)
    return counted


def attended_span(args: argparse.Namespace) -> int:
    """The slots the counted step attends over (its rows padded to their bucket)."""
    return span_for(args.cached + args.rows + bucket_for(args.rows), LEAST_SPAN, args.capacity)


def main() -> None:
    args = parse_args()
    widths = "shrunk" if args.shrunk else "its widths"
    print(f"| {args.alias} ({widths}), a step of {args.rows} rows after {args.cached + args.rows} cached, over "
          f"{attended_span(args)} of {args.capacity} slots | ops a layer | MB written a layer | "
          "ops outside the layers | each op a layer |")
    print("|---|---|---|---|---|")
    for prepared in (False, True):
        one, two = (step_ops(args, layers, prepared) for layers in (1, 2))
        layer = two.ops - one.ops
        each = ", ".join(f"{name} {count}" for name, count in sorted(layer.items()))
        form = "prepared for CUDA" if prepared else "as transformers builds it"
        print(f"| {form} | {layer.total()} | {(two.written - one.written) / 1e6:.2f} | "
              f"{one.ops.total() - layer.total()} | {each} |")


if __name__ == "__main__":
    main()
