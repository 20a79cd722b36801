"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class SpecchatError(Exception):
    """An error caused by the user's input or environment, shown as one clear line."""


class PlanRefusal(SpecchatError):
    """The memory plan's refusal for want of room: which room (`tier`: device, host or disk) is
    short, by how many bytes (`missing`; 0 where no single figure says it), and the option that
    would fit (`fits`, None when none is known). Decisions (auto, doctor) catch this type, never
    read the message."""

    def __init__(self, message: str, tier: str, missing: int, fits: str | None = None) -> None:
        super().__init__(message if fits is None else f"{message}; {fits}")
        self.reason, self.tier, self.missing, self.fits = message, tier, missing, fits


class ContextOverflow(SpecchatError):
    """A prompt that fills the target's context, leaving no room for a reply."""

    def __init__(self, prompt_tokens: int, context: int) -> None:
        super().__init__(f"the prompt is {prompt_tokens} tokens, which leaves no room for a reply in the "
                         f"{context}-token context: shorten it")
