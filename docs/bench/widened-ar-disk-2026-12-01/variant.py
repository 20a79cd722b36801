"""`specchat ARGS...` with quant/widened.py's widening left out where argv[1] says (the disk-tier
bisection of 2026-12-01, rows.txt): none (as committed), plan, walk, both, q6only, denseonly, and
any of them with "+mm" (three float32 matmuls first). Run: python variant.py both generate ..."""
import sys

import specchat.loader as loader
import specchat.plan.model as plan_model
import specchat.quant.prepacked as prepacked
from specchat.quant.q6k_linear import Q6Linear

which = sys.argv.pop(1)
if which.endswith("+mm"):
    import torch
    which = which[:-3]
    a, b = torch.randn(64, 1536), torch.randn(8960, 1536)
    for _ in range(3):
        torch.mm(a, b.t())
if which in ("plan", "both"):
    plan_model.widened_rows = lambda dtype: None
if which in ("walk", "both"):
    prepacked.widened_rows = lambda dtype: None
if which == "q6only":
    prepacked.widens = lambda module: False
if which == "denseonly":
    widen_all = loader.widen_linears
    loader.widen_linears = lambda modules, device, dtype: widen_all(
        [m for m in modules if not isinstance(m, Q6Linear)], device, dtype)

from specchat.cli import main  # noqa: E402 (after the patches)

sys.argv = ["specchat", *sys.argv[1:]]
main()
