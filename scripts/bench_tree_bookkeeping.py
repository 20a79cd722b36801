"""The draft tree's bookkeeping alone: SpecExec's growth (decoding/specexec.py `grow`) over a
draft that answers at once, so that every second timed is the host's (its masks, offers and
ranks). Each step's children are ranked (gpu_check --pair's shape: the j-th child scores -j), so
the tree fills its budget at its full depth whatever the stand-in's answers; the draft cache is
counted, not filled. Prints, per tree, its steps and the bookkeeping's ms (the first tree warms up).
With --auto the tree grows as `--budget auto` grows it, its sizer weighing each step and the cut
(decoding/autosize.py), the budget its cap, over costs that make drafting all but free (so that
it grows to the cap) and the draft's children its random log-probs, not ranks.

    python scripts/bench_tree_bookkeeping.py                    # budget 2048, 24 levels, 4 trees
    python scripts/bench_tree_bookkeeping.py --budget 1024 --trees 8 --threads 1
    python scripts/bench_tree_bookkeeping.py --auto --budget 2048 --threads 1
"""

import argparse

import torch

from specchat.decoding import specexec
from specchat.decoding.autosize import AutoSizer, Costs
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.tree import TreeShape

HIDDEN = 8  # the stand-in's hidden rows: never read but by itself
VOCAB = 32000
PROMPT = 300  # committed tokens before the tree


class CountedCache:
    """A draft cache that only counts its slots."""

    def __init__(self, length: int) -> None:
        self.length = length


class InstantDraft(CausalLM):
    """A draft whose steps cost nothing: its hidden rows are zeros, its children random."""

    def __init__(self, seed: int) -> None:
        super().__init__(model=None)
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def hidden(self, tokens, positions, cache, mask=None) -> torch.Tensor:
        cache.length += tokens.numel()
        return torch.zeros(tokens.numel(), HIDDEN)

    def top_logprobs(self, hidden, k, temperature, allowed=None) -> tuple[torch.Tensor, torch.Tensor]:
        rows = hidden.shape[0]
        values = torch.rand(rows, k, generator=self.generator).log().sort(dim=1, descending=True).values
        return values, torch.randint(0, VOCAB, (rows, k), generator=self.generator)


def grown(draft: InstantDraft, shape: TreeShape) -> specexec.GrownTree:
    root = specexec.Root(token=1, slot=PROMPT - 1, position=PROMPT - 1, hidden=torch.zeros(1, HIDDEN))
    return specexec.grow(draft, CountedCache(PROMPT), root, shape, SamplingParams(temperature=0.0))


def tree_shape(budget: int, depth: int, auto: bool) -> TreeShape:
    if not auto:
        return TreeShape(budget=budget, max_depth=depth, ranked_tree=True)
    free = Costs(target_n=(1, budget), target_s=(0.1, 0.1), draft_b=(1, budget), draft_s=(1e-6, 1e-6))
    return TreeShape(budget=budget, max_depth=depth, sizer=AutoSizer(free, cap=budget, learns_costs=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--trees", type=int, default=4)
    parser.add_argument("--threads", type=int, help="torch's threads (default: as torch starts)")
    parser.add_argument("--auto", action="store_true", help="grow as --budget auto does, the budget its cap")
    args = parser.parse_args()
    if args.budget < 1 or args.depth < 1 or args.trees < 1:
        parser.error("--budget, --depth and --trees are at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    shape, draft = tree_shape(args.budget, args.depth, args.auto), InstantDraft(seed=0)
    print("| tree | steps | nodes | depth | bookkeeping, ms |")
    print("|---|---|---|---|---|")
    for index in range(args.trees):
        tree = grown(draft, shape)
        print(f"| {index + 1} | {tree.steps} | {tree.tree.size} | {tree.tree.depth} | {tree.host_s * 1e3:.1f} |")


if __name__ == "__main__":
    main()
