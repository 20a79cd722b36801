"""Draft stems (stems.py): the merged tree keeps one candidate per stem, every node the draft ran
holds the draft's own logits at its prefix, a node's log-probability is its parent's plus that of
its token under the distribution the stems sampled there, and each stem's token at a position is
the inverse CDF of its own DRAFT uniform keyed by that absolute position (a key the next iteration
cannot repeat: keyed by depth instead, a stem's draws would recur every iteration). SpecInfer's
laws hold for any draft, so only these pin what its draft computes: stems drawn by depth still
gave lossless, seeded-reproducible replies."""

import math

import pytest
import torch
from helpers.engines import PROMPT, SAMPLINGS

from specchat.decoding.kvcache import new_cache
from specchat.decoding.specexec import catch_up
from specchat.decoding.speculative_sampling import distribution, draw_draft
from specchat.decoding.stems import StemLayout, Stems, draft_stems

LAYOUT = StemLayout(stems=6, length=3)


def grown(draft, sampling) -> Stems:
    cache = new_cache()
    return draft_stems(draft, cache, catch_up(draft, cache, torch.tensor(PROMPT), 0), LAYOUT, sampling)


def path(stems: Stems, node: int) -> list[int]:
    """The tokens after the prompt down to `node` (the root is the prompt's last token)."""
    tokens = []
    while node != 0:
        tokens.append(int(stems.tree.tokens[node]))
        node = int(stems.tree.parents[node])
    return tokens[::-1]


def test_stem_tree_merges_prefixes_and_keeps_one_candidate_per_stem(tiny_draft):
    layout, stems = LAYOUT, grown(tiny_draft, SAMPLINGS[1])
    tree = stems.tree
    assert 3 <= tree.size <= 18 and tree.depth == 3
    assert tree.size < 18  # this draft is peaked enough that stems share prefixes
    through = torch.zeros(tree.tokens.numel(), dtype=torch.long)  # stems through each node
    through[0] = layout.stems
    for node, candidates in enumerate(stems.candidates):
        assert all(int(tree.parents[child]) == node for child in candidates)
        for child in candidates:
            through[child] += 1
        # every stem through a node above the last depth continues from it
        assert len(candidates) == (int(through[node]) if int(tree.depths[node]) < layout.length else 0)
    # nodes the draft ran (all but the leaves) hold their logits and a draft cache slot
    ran = (tree.depths < layout.length).nonzero().flatten().tolist()
    assert sorted(stems.draft_logits) == ran
    assert (stems.draft_slots[tree.depths < layout.length] >= 0).all()
    assert (stems.draft_slots[tree.depths == layout.length] == -1).all()


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t0.6", "t1"])
def test_each_node_the_draft_ran_holds_its_logits_at_the_nodes_prefix(tiny_draft, sampling):
    stems = grown(tiny_draft, sampling)
    assert len(stems.draft_logits) > 1 + LAYOUT.stems // 3  # the root and nodes of the depths below
    for node, logits in stems.draft_logits.items():
        sequence = PROMPT + path(stems, node)
        alone = tiny_draft.hidden(torch.tensor(sequence), torch.arange(len(sequence)), new_cache())
        # bitwise: the tiny float64 draft gave a largest difference of 0.0 over both samplings' nodes
        # (this AVX2 EPYC, 2026-12-04), as its static step equals its eager one (test_static_step.py)
        assert torch.equal(logits, tiny_draft.logits(alone)[-1])


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t0.6", "t1"])
def test_a_nodes_logprob_adds_its_tokens_under_what_the_stems_sampled(tiny_draft, sampling):
    stems = grown(tiny_draft, sampling)
    tree, root_position = stems.tree, len(PROMPT) - 1
    for node in range(1, tree.tokens.numel()):
        parent, token = int(tree.parents[node]), int(tree.tokens[node])
        q = distribution(stems.draft_logits[parent], sampling, root_position + int(tree.depths[node]))
        expected = float(tree.logprobs[parent]) + math.log(float(q[token]))
        # the store keeps float32 sums: 4.5e-7 at most from the float64 sum, measured over both
        # samplings' nodes (this AVX2 EPYC, 2026-12-04); the bound is twice that
        assert float(tree.logprobs[node]) == pytest.approx(expected, rel=0, abs=9e-7)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t0.6", "t1"])
def test_each_stem_draws_its_tokens_with_its_uniform_of_the_absolute_position(tiny_draft, sampling):
    stems = grown(tiny_draft, sampling)
    tree, root_position = stems.tree, len(PROMPT) - 1
    heads, taken = [0] * LAYOUT.stems, [0] * tree.tokens.numel()  # stems' nodes; candidates read at each
    for depth in range(1, LAYOUT.length + 1):
        for stem, node in enumerate(heads):
            child = stems.candidates[node][taken[node]]  # the stems through a node, in stem order
            taken[node] += 1
            position = root_position + depth
            q = distribution(stems.draft_logits[node], sampling, position)
            assert int(tree.tokens[child]) == draw_draft(q, sampling.seed, stem, position)
            heads[stem] = child
    assert len(set(heads)) > 1  # the stems did not all share one path
