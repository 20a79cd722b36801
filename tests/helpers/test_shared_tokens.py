"""tests/helpers/shared_tokens.py: a kind's references are computed once and read back as they were."""

from helpers.shared_tokens import SharedTokens

REFERENCES = [([1, 2, 3], [4, 5]), ([6], [])]


def test_the_first_asker_computes_and_later_ones_read_the_file(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return REFERENCES

    assert SharedTokens(tmp_path).get("seeded", compute) == REFERENCES
    # another worker: its own instance over the same folder, never computing
    assert SharedTokens(tmp_path).get("seeded", lambda: calls.append(1) or []) == REFERENCES
    assert calls == [1]
    assert SharedTokens(tmp_path).get("greedy", lambda: [([7], [8])]) == [([7], [8])]  # kinds apart
