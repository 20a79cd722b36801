"""The ranges every front end accepts for the decoding settings, and their defaults: one home, so
`generate`, `run`, `bench` and the chat's slash commands agree on them."""

from dataclasses import dataclass

from specchat.errors import SpecchatError


@dataclass(frozen=True)
class Bounds:
    """The range [low, high], or (low, high] when `low_open`."""

    low: float
    high: float
    low_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def describe(self) -> str:
        if self.low_open:
            return f"in ({self.low:g}, {self.high:g}]"
        return f"between {self.low:g} and {self.high:g}"

    def problem(self, name: str, value: float) -> str | None:
        """Why `value` is not acceptable for `name`, in one line; None when it is."""
        return None if value in self else f"{name} must be {self.describe()} (got {value})"

    def check(self, name: str, value: float) -> None:
        """Raise the one-line error for a value of the option `name` out of range."""
        problem = self.problem(name, value)
        if problem:
            raise SpecchatError(problem)


BUDGET = Bounds(1, 8192)  # draft tree size K
DEPTH = Bounds(1, 256)  # deepest draft tree node D
LOOKAHEAD = Bounds(1, 64)  # dsi: drafts per verification job
MAX_TOKENS = Bounds(1, 32768)  # new tokens per reply
TEMPERATURE = Bounds(0.0, 5.0)  # 0 = greedy
TOP_P = Bounds(0.0, 1.0, low_open=True)  # nucleus sampling mass
MEMORY_BUDGET_GB = Bounds(0.0, 1e6, low_open=True)  # --ram-budget and --vram-budget, in GB (1e9 bytes)

OFFLOAD_TIERS = ("auto", "none", "ram", "disk")
DEFAULT_OFFLOAD = "auto"  # layers placed in the fastest tier with room (specchat.offload.placement)

DEFAULT_TEMPERATURE = 0.6
DEFAULT_TOP_P = 0.9
DEFAULT_SEED = 0
DEFAULT_MAX_DEPTH = 24
DEFAULT_LOOKAHEAD = 5
DEFAULT_DTYPE = "bfloat16"
# Tokens the draft's LM head scores; 0 = all. The FR-Spec sub-vocabulary (--draft-vocab 32768,
# ranked on the standard library's sources) cut drafting 17% but lowered the gen rate on MT-Bench
# more than that (docs/benchmarks.md, "Draft levers"), so it is an option, not the default.
DEFAULT_DRAFT_VOCAB = 0
FR_SPEC_VOCAB = 32768  # the sub-vocabulary size measured


def default_budget(cuda: bool, offloaded: bool) -> int:
    """The draft tree size K that pays on this device.

    In memory on a CPU the draft costs ~0.4x the target per step, so small trees pay best
    (docs/benchmarks.md); a GPU scores hundreds of tokens for the price of a few. Offloaded, a
    target pass costs the weights' transfer time whatever the tree size, so trees grow large;
    on a CPU drafting a tree of more than a few hundred tokens costs more than it gains.
    """
    if offloaded:
        return 1024 if cuda else 256
    return 256 if cuda else 16


def auto_cap(cuda: bool, offloaded: bool) -> int:
    """The largest tree --budget auto may choose: a bound on one target pass's size (and so its
    memory), well past where the measured costs stop a tree from growing."""
    if offloaded:
        return 2048 if cuda else 1024
    return 1024 if cuda else 128
