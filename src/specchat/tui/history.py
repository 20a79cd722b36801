"""Up/Down recall of earlier inputs, keeping the unsent draft to come back to."""


class InputHistory:
    def __init__(self, entries: list[str]) -> None:
        self.entries = list(entries)
        self.position: int | None = None  # index being shown; None = the draft
        self.draft = ""

    def add(self, text: str) -> None:
        if not self.entries or self.entries[-1] != text:
            self.entries.append(text)
        self.position = None

    def previous(self, current: str) -> str | None:
        """The entry before the one shown (or the latest, when editing the draft)."""
        if not self.entries:
            return None
        if self.position is None:
            self.draft = current
            self.position = len(self.entries)
        self.position = max(0, self.position - 1)
        return self.entries[self.position]

    def next(self) -> str | None:
        """The entry after the one shown, then the draft; None when not browsing."""
        if self.position is None:
            return None
        self.position += 1
        if self.position == len(self.entries):
            self.position = None
            return self.draft
        return self.entries[self.position]
