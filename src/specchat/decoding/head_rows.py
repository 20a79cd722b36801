"""How many rows of the target's LM head the verification walk computes in one call (node_logits.py).

Each call of the head reads its whole [V x H] weight. Where that read bounds the product (a GPU; a
CPU with bf16 instructions, or a prepacked product), eight rows cost about what one does, so the
walk computes the draft's likeliest path and the likeliest other nodes in one batch: a row it
then skips cost nothing, and a row it later needs would cost another read. Where each row costs
what a call does instead (bf16 on a CPU without bf16 instructions, where the product is emulated
and compute-bound: the 1.5B's 151936 x 1536 head took 23.6 ms at one row and 183.5 ms at eight on
an AVX2 AMD EPYC), every row computed and not visited is lost time, and a small tree's upfront
rows outnumber the rows its walk visits: the walk then computes each row as it reaches it.

Which of the two is measured on the loaded head itself, once per load (a fraction of a second
where rows are costly, milliseconds elsewhere): the two costs sit far either side of the bound
(a ratio near 1 or near 8 against PER_ROW_RATIO's 4), so a measurement at each startup does not
flip between them as a close choice would.
"""

from collections.abc import Callable

import torch

from specchat.quant.timing import best_seconds

BATCH_ROWS = 8  # a batched call's rows, beyond the likeliest path (which it computes whole)
# Eight rows costing more than this many single rows: the walk of a tree visits about this many
# rows (the accepted tokens and the one after them), so computing them as visited costs less.
PER_ROW_RATIO = 4.0


def rows_for(one_s: float, eight_s: float) -> int:
    """The rows a head call holds, from its measured seconds over one row and over BATCH_ROWS rows."""
    return 1 if eight_s > PER_ROW_RATIO * one_s else BATCH_ROWS


def measure_head_rows(logits: Callable[[torch.Tensor], torch.Tensor], hidden_size: int, dtype: torch.dtype,
                      device: torch.device) -> int:
    """`rows_for` the head `logits` (hidden rows [m, H] -> logits) as timed here: the fastest of a
    few calls over one row and over BATCH_ROWS rows, interleaved."""
    hidden = torch.randn(BATCH_ROWS, hidden_size, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    one_s, eight_s = best_seconds([lambda: logits(hidden[:1]), lambda: logits(hidden)], device)
    return rows_for(one_s, eight_s)
