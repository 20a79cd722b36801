"""The corpora read from PyPI packages: ShareGPT's truncated JSON array is read item by item."""

import io
import json

import pytest

from specchat.corpora import json_array_items


ITEMS = [
    {"id": "a", "text": "caf\u00e9 \U0001f600 \"quoted\" back\\slash", "n": 12.5e-3, "ok": True, "none": None},
    {"id": "b", "list": [1, 22, 333], "nested": {"x": False}},
    {"id": "c", "text": "\u4e2d\u6587 and more text"},
]


@pytest.mark.parametrize("chunk_chars", [1, 5, 13, 1 << 20])
def test_a_cut_array_yields_exactly_its_complete_items(chunk_chars: int) -> None:
    """Cut anywhere, read in chunks of any size: so cut inside escapes, numbers and literals too."""
    parts = [json.dumps(item) for item in ITEMS]  # ensure_ascii: \uXXXX escapes and a surrogate pair
    text = "[\n " + ",\n ".join(parts) + "\n]"
    ends = [text.index(part) + len(part) for part in parts]
    for cut in range(1, len(text) + 1):
        complete = sum(end <= cut for end in ends)
        assert list(json_array_items(io.StringIO(text[:cut]), chunk_chars)) == ITEMS[:complete], cut


def test_a_corrupt_item_is_not_taken_for_a_cut() -> None:
    with pytest.raises(json.JSONDecodeError):
        list(json_array_items(io.StringIO('[{"a": 1}, {"a": nope}, {"a": 3}]')))
