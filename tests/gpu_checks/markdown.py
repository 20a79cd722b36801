"""A Markdown table, so that what a check prints can go into docs/benchmarks.md as it is."""


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ms(value: float | None) -> str:
    """Milliseconds as the tables print them; n/a where nothing was measured."""
    return "n/a" if value is None else f"{value:.3f}"
