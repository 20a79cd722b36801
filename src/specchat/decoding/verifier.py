"""Tree verification: SpecExec's Algorithm 1.

Walk down from the root, sampling each next token from the *target* distribution cached at the
current node. A sampled token that is a child in the tree moves the walk there; any other token
(a cache miss) is emitted and ends the iteration. Every emitted token is therefore a genuine
sample of the target at its position, with the randomness of that position, so the output is
token-for-token what sequential sampling would give.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from specchat.decoding.events import SamplingParams
from specchat.decoding.sampling import sample_token
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
    node, path, tokens, accepted = 0, [0], [], 0
    while True:
        token = sample_token(node_logits(node), sampling, first_position + len(tokens))
        tokens.append(token)
        child = tree.children[node].get(token)
        stopped = token in stop_ids
        if child is not None:
            accepted += 1
        if child is None or stopped or len(tokens) >= max_tokens:
            return Verdict(path=path, tokens=tokens, accepted=accepted, stopped=stopped)
        node = child
        path.append(node)
