"""docs/benchmarks.md opens with its table of current figures, stays short (the journal lives in
docs/benchmarks-history.md), and every row links a section that exists."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
MAX_LINES = 400
LINK = re.compile(r"\]\(([\w.-]*\.md)?#([\w-]+)\)")


def anchor(heading: str) -> str:
    """A markdown heading's anchor as GitHub makes it: lower case, punctuation dropped but
    hyphens and underscores, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


def test_the_benchmarks_page_opens_with_its_table_and_stays_short():
    lines = (DOCS / "benchmarks.md").read_text().splitlines()
    assert len(lines) < MAX_LINES
    first_row = next(index for index, line in enumerate(lines) if line.startswith("|"))
    assert first_row < 8 and lines[first_row].startswith("| figure |")


def current_figures() -> list[str]:
    """The rows of the page's first table (the sections below have tables of their own)."""
    lines = (DOCS / "benchmarks.md").read_text().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("| figure |"))
    end = next((index for index in range(start, len(lines)) if not lines[index].startswith("|")), len(lines))
    return lines[start + 2:end]


def test_every_row_of_the_table_links_a_section_that_exists():
    rows = current_figures()
    assert rows
    for row in rows:
        links = LINK.findall(row)
        assert links, row
        for page, target in links:
            assert target in anchors(DOCS / (page or "benchmarks.md")), (page, target)


def test_the_anchor_rule_matches_a_heading_with_punctuation():
    assert anchor(" What \"exact\" means for the packed target in bfloat16, 2026-11-25 (night)") == \
        "what-exact-means-for-the-packed-target-in-bfloat16-2026-11-25-night"
