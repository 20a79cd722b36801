"""Predicted outputs (decoding/prediction.py): the cursor that follows a reply through its
prediction and finds its place again after an edit, the chain a SpecExec tree holds below its
root (tree.add_chain), and the reply, exactly the one decoded without the prediction, accepted a
chain at a time where it repeats the prediction."""

from dataclasses import replace

import numpy as np
import pytest
from helpers.engines import GREEDY, run

from specchat.decoding.autoregressive import AutoregressiveEngine
from specchat.decoding.autosize import AutoSizer, Costs
from specchat.decoding.events import SamplingParams
from specchat.decoding.prediction import Prediction, quoted_prediction
from specchat.decoding.specexec import SPECEXEC
from specchat.decoding.tree import NodeStore, TreeShape, add_chain, assemble
from specchat.decoding.tree_engine import TreeEngine


def followed(prediction: Prediction, tokens: list[int]) -> Prediction:
    for token in tokens:
        prediction.accept(token)
    return prediction


def test_the_cursor_follows_the_reply_and_counts_what_it_accepted():
    prediction = followed(Prediction((5, 6, 7, 8, 9)), [5, 6])
    assert prediction.chain(2) == (7, 8) and prediction.accepted == 2 and prediction.rejected == 3
    assert followed(prediction, [7, 8, 9]).chain(4) == () and prediction.rejected == 0


def test_after_an_edit_the_cursor_finds_its_place_where_the_reply_repeats_three_tokens():
    """The reply changes token 3 (30 for 3), then goes on as predicted: lost until three tokens
    past the change occur in the prediction, then at the token after them."""
    prediction = Prediction(tuple(range(1, 11)))
    followed(prediction, [1, 2, 30])
    assert prediction.chain(3) == ()
    followed(prediction, [4, 5])
    assert prediction.chain(3) == ()  # 30 4 5 occurs nowhere
    followed(prediction, [6])
    assert prediction.chain(3) == (7, 8, 9) and prediction.accepted == 2  # realigning counts nothing


def test_of_repeated_text_the_cursor_takes_the_first_occurrence_after_its_last_place():
    prediction = Prediction((1, 2, 3, 9, 1, 2, 3, 8, 4))
    followed(prediction, [1, 2, 3, 9, 7, 1, 2, 3])  # an insertion (7) after the first block
    assert prediction.chain(2) == (8, 4)


def test_an_edit_repeating_the_text_just_followed_goes_on_after_it_not_at_a_later_copy():
    prediction = Prediction((1, 2, 3, 9, 1, 2, 3, 8, 4))
    followed(prediction, [1, 2, 3, 7, 1, 2, 3])  # 1 2 3 written twice, the first time as predicted
    assert prediction.chain(2) == (9, 1)


def test_the_cursor_finds_its_place_up_to_the_predictions_last_three_tokens():
    prediction = followed(Prediction(tuple(range(1, 11))), [1, 2, 30, 7, 8, 9])  # a jump to its end
    assert prediction.chain(3) == (10,)
    assert followed(Prediction(tuple(range(1, 11))), [1, 2, 30, 8, 9, 10]).chain(3) == ()


def tree_of(parents: list[int], tokens: list[int], logprobs: list[float]) -> NodeStore:
    """A store whose kept nodes are 1..n (node 0 the root, token 0)."""
    store = NodeStore(0, 5)
    store.append(np.array(tokens), np.array(parents), np.zeros(len(tokens), dtype=np.int64),
                 np.array(logprobs, dtype=np.float32))
    for node, parent in enumerate(parents, start=1):
        store.depths[node] = store.depths[parent] + 1
    store.kept = np.arange(1, store.count)
    return store


def paths(store: NodeStore) -> set[tuple[int, ...]]:
    tree = assemble(store, 0).tree
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    assert all(parent < node for node, parent in enumerate(parents) if node)  # parents precede children

    def path(node: int) -> tuple[int, ...]:
        return () if node == 0 else (*path(parents[node]), tokens[node])
    return {path(node) for node in range(1, len(parents))}


class Letters:
    """A token a character, as the chat's quoted code reaches quoted_prediction."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert not add_special_tokens  # the reply's tokens hold no BOS
        return [ord(char) for char in text]


def test_quoted_code_scores_no_chain_until_the_reply_reaches_it():
    """An edit's reply opens its fence: once its last three tokens are the fence's, the chain is
    the code (a character a token here, so "\n``" first places it at the closing fence, and "`p"
    then at the opening one)."""
    prediction = quoted_prediction("Fix it:\n```py\nx = 1\n```\n", Letters())
    assert prediction.tokens == tuple(ord(char) for char in "```py\nx = 1\n```")
    assert prediction.chain(4) == ()  # an explanation that never quotes it costs nothing
    followed(prediction, [ord(char) for char in "Sure:\n"])
    assert prediction.chain(4) == ()
    followed(prediction, [ord(char) for char in "```py"])
    assert prediction.chain(4) == tuple(ord(char) for char in "\nx =")


def test_a_message_quoting_no_code_predicts_nothing():
    assert quoted_prediction("What is a mutex?", Letters()) is None


def test_a_chain_goes_through_the_draft_nodes_that_hold_its_tokens_then_below_them():
    store = tree_of([0, 1, 0], [4, 5, 6], [-0.1, -0.5, -1.0])  # 4 -> 5, and 6
    add_chain(store, (4, 5, 7, 8), budget=16)
    assert paths(store) == {(4,), (4, 5), (6,), (4, 5, 7), (4, 5, 7, 8)}
    assert store.logprobs[-1] == store.logprobs[2] == np.float32(-0.5)  # ranked as the node they follow
    assert store.depths[-2:].tolist() == [3, 4]  # below 4 -> 5: their positions in the target's pass
    assert store.parents.size == store.depths.size == store.slots.size == store.count  # a node a row in each


def test_a_chain_past_the_budget_takes_the_place_of_the_lowest_ranked_draft_leaves():
    store = tree_of([0, 1, 0, 3], [4, 5, 6, 9], [-0.1, -0.5, -1.0, -2.0])
    add_chain(store, (4, 7), budget=4)
    assert paths(store) == {(4,), (4, 5), (6,), (4, 7)}  # 6 -> 9, the lowest, gave way
    add_chain(store, (4, 7, 3, 2), budget=4)
    assert paths(store) == {(4,), (4, 7), (4, 7, 3), (4, 7, 3, 2)}  # the chain's own nodes stay


def test_a_chain_that_fills_the_budget_exactly_leaves_every_draft_node():
    store = tree_of([0, 1, 0], [4, 5, 6], [-0.1, -0.5, -1.0])
    add_chain(store, (4, 7), budget=4)
    assert paths(store) == {(4,), (4, 5), (6,), (4, 7)}


SAMPLED = SamplingParams(1.0, 1.0, seed=5)
COSTLY_DRAFT = Costs(target_n=(1, 129), target_s=(0.1, 1.0), draft_b=(1, 128), draft_s=(0.2, 0.2))


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("auto", [False, True], ids=["fixed", "auto"])
def test_specexec_with_a_prediction_emits_the_targets_own_tokens_a_chain_at_a_time(tiny_target, tiny_draft,
                                                                                  sampling, auto):
    """Predicted: the reply itself with one token changed in its middle. The reply is the target's
    (greedy or seeded) whatever the prediction; where it repeats the prediction a tree accepts up
    to a chain (8 deep) an iteration, where the tiny draft alone gets fewer than 2 a tree."""
    reference, _ = run(AutoregressiveEngine(tiny_target, []), sampling)
    edited = tuple(reference[:20]) + (reference[20] + 1,) + tuple(reference[21:])
    if auto:  # a draft the sizer finds too dear to draft with: the chain is scored anyway
        sizer = AutoSizer(COSTLY_DRAFT, cap=128, learns_costs=False)
        engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(128, 8, sizer=sizer), sizer)
    else:
        engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=8, max_depth=8))
    alone, alone_events = run(engine, sampling)
    engine.forget()
    prediction = Prediction(edited)
    tokens, events = run(engine, replace(sampling, prediction=prediction))
    assert tokens == alone == reference
    assert len(events) <= 10 < len(alone_events)  # 40 tokens: the prompt's pass, then chains of 8 (a miss at 20)
    assert prediction.accepted >= 36 and max(event.accepted for event in events) == 8


def test_a_wrong_prediction_changes_no_token(tiny_target, tiny_draft):
    engine = TreeEngine(SPECEXEC, tiny_target, tiny_draft, [], TreeShape(budget=8, max_depth=4))
    reference, _ = run(AutoregressiveEngine(tiny_target, []), SAMPLED)
    tokens, _ = run(engine, replace(SAMPLED, prediction=Prediction(tuple(range(100, 140)))))
    assert tokens == reference
