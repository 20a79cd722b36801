"""The online estimates of `--budget auto` (autosize.py), each a running ratio decayed per record:
- acceptance c = accepted tokens / the draft's uncalibrated prediction A of them;
- branching m = the kept children's probability mass / their expanded parents' mass;
- draft and target time = the mean, over iterations, of what one took / what the probed costs
  predicted for it (the probe times bare forwards; an iteration also catches up, keeps its tree's
  books and samples); the target alone's one-token step apart from the tree passes, starting
  from their ratio: the probe's curve can misjudge one width against the others (on a CPU one
  row runs the fused int4 kernel, a tree the dense copies), and that step is what drafting is
  weighed against;
- and the tokens per second the last few drafting iterations achieved, against which the target
  alone's step is weighed before a tree is grown. A rate observed, not predicted from a typical
  tree: the rate of a mean tree is not the mean rate (a 20-node tree among 1-node ones made a
  prediction that drafting lost where it paid 1.2x).
"""

from dataclasses import dataclass, field

PRIOR_ITERATIONS = 2.0  # weight of each starting value, in iterations
DECAY = 0.95  # per record: an estimate follows roughly the last 20 records
# Drafting iterations recorded before the rate of drafting is judged. A reply's tokens an iteration
# swing from 1 to 10 and more: judged after 3 (and over the last 5), drafting that paid 1.1-1.25x
# was turned off in 5 of 6 sampled replies; after 6, over the last 20, rarely. Learning costs those
# iterations where drafting loses (with a bf16 draft here, ~1% of a 64-token reply each).
MIN_TREES = 6


@dataclass
class Ratio:
    """observed / predicted, both sums decayed per record; it starts at `prior`."""

    observed: float
    predicted: float = PRIOR_ITERATIONS

    @classmethod
    def starting_at(cls, prior: float) -> "Ratio":
        return cls(observed=prior * PRIOR_ITERATIONS)

    @property
    def value(self) -> float:
        return self.observed / self.predicted

    def record(self, predicted: float, observed: float) -> None:
        self.observed = DECAY * self.observed + observed
        self.predicted = DECAY * self.predicted + predicted

    def record_time(self, predicted_s: float, observed_s: float) -> None:
        """One iteration's observed / predicted seconds, weighing as one record whatever the
        iteration's length (the prior's weight is in records: summed seconds would make it weigh
        as much as 50 iterations of 40 ms, or a fraction of one of 10 s)."""
        if predicted_s > 0:
            self.record(1.0, observed_s / predicted_s)


@dataclass
class DraftingMemory:
    """Decayed sums of the recent drafting iterations' tokens and seconds (a catch-up's excess
    over a steady one's taken off): the rate drafting achieves, as the sizer grows its trees.
    None is judged until MIN_TREES iterations drafted."""

    count: int = 0
    tokens: float = 0.0
    seconds: float = 0.0
    weight: float = 0.0

    def record(self, tokens: int, seconds: float) -> None:
        self.count += 1
        self.tokens = DECAY * self.tokens + tokens
        self.seconds = DECAY * self.seconds + seconds
        self.weight = DECAY * self.weight + 1

    @property
    def known(self) -> bool:
        return self.count >= MIN_TREES

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def mean_tokens(self) -> float:
        return self.tokens / self.weight

    @property
    def mean_seconds(self) -> float:
        return self.seconds / self.weight


@dataclass
class Calibration:
    """Every running estimate of one sizer."""

    accepted: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))
    kept_mass: Ratio = field(default_factory=lambda: Ratio.starting_at(0.9))
    draft_time: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))
    target_time: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))
    alone_time: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))  # relative to target_time's
    catch_up_time: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))  # of catch-ups past a steady one
    drafting: DraftingMemory = field(default_factory=DraftingMemory)

    @property
    def acceptance(self) -> float:
        return self.accepted.value

    @property
    def branching(self) -> float:
        return self.kept_mass.value

    @property
    def alone(self) -> float:
        """The target alone's time ratio: the tree passes' (the same machine's sampling, context
        and host work, which the probe left out), times what the alone steps showed beside it."""
        return self.target_time.value * self.alone_time.value

    def record(self, predicted: float, observed: int) -> None:
        """One iteration's uncalibrated prediction A and the tokens verification accepted."""
        self.accepted.record(predicted, observed)

    def record_expansion(self, parent_mass: float, child_mass: float) -> None:
        self.kept_mass.record(parent_mass, child_mass)
