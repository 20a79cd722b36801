"""Tree verification: SpecExec's Algorithm 1.

Walk down from the root, sampling each next token from the *target* distribution cached at the
current node. A sampled token that is a child in the tree moves the walk there; any other token
(a cache miss) is emitted and ends the iteration. Every emitted token is therefore a genuine
sample of the target at its position, with the randomness of that position, so the output is
token-for-token what sequential sampling would give.

`descend` is that walk's loop with the choice at each node left open; SpecInfer's multi-step
speculative sampling (specinfer.py) walks with it too.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from specchat.decoding.events import SamplingParams
from specchat.decoding.sampling import emit_token
from specchat.decoding.tree import DraftTree


@dataclass
class Verdict:
    path: list[int]  # tree nodes whose tokens are now committed with a target KV slot, root first
    tokens: list[int]  # tokens emitted this iteration
    accepted: int  # how many emitted tokens were draft tokens found in the tree
    stopped: bool  # a stop token was emitted


def verify(
    tree: DraftTree,
    node_logits: Callable[[int], torch.Tensor],
    sampling: SamplingParams,
    first_position: int,
    max_tokens: int,
    stop_ids: Collection[int],
) -> Verdict:
    """Emit up to `max_tokens` tokens; the first one is at absolute position `first_position`."""
    def step(node: int, position: int) -> tuple[int, int | None]:
        token = emit_token(node_logits(node), sampling, position)
        return token, tree.children[node].get(token)

    return descend(step, first_position, max_tokens, stop_ids)


Step = Callable[[int, int], tuple[int, int | None]]  # (node, position) -> (token, child or None)


def descend(step: Step, first_position: int, max_tokens: int, stop_ids: Collection[int]) -> Verdict:
    """The walk every tree engine shares: from the root, emit the token `step` gives for each
    node at its absolute position and move to the child it names. The walk ends at a miss (no
    child: the token came from the target alone), at a stop token, or after `max_tokens`
    tokens; every token that names a child is a drafted one, so all but a final miss count as
    accepted."""
    path, tokens = [0], []
    while True:
        token, child = step(path[-1], first_position + len(tokens))
        tokens.append(token)
        stopped = token in stop_ids
        if child is None or stopped or len(tokens) >= max_tokens:
            return Verdict(path=path, tokens=tokens, accepted=len(tokens) - (child is None), stopped=stopped)
        path.append(child)
