"""The online estimates of `--budget auto` (autosize.py), each a running ratio decayed per record:
- acceptance c = accepted tokens / the draft's uncalibrated prediction A of them;
- branching m = the kept children's probability mass / their expanded parents' mass;
- draft and target time = the mean, over iterations, of what one took / what the probed costs
  predicted for it (the probe times bare forwards; an iteration also catches up, keeps its tree's
  books and samples); the target alone's one-token step apart from the tree passes, starting
  from their ratio: the probe's curve can misjudge one width against the others (on a CPU one
  row runs the fused int4 kernel, a tree the dense copies), and that step is what drafting is
  weighed against;
- and what the last few trees were like (their predicted A, size and draft steps' probed seconds),
  from which the rate of drafting is predicted before a tree is grown. These follow fewer trees:
  the first trees of a run are grown under the starting calibration (c = 1, optimistic: larger
  trees than the calibrated sizer grows), and a mean over them would misjudge the trees to come.
"""

from dataclasses import dataclass, field

PRIOR_ITERATIONS = 2.0  # weight of each starting value, in iterations
DECAY = 0.95  # per record: an estimate follows roughly the last 20 records
TREE_DECAY = 0.7  # per tree: the typical tree follows roughly the last 3
MIN_TREES = 3  # trees recorded before the typical tree is judged at all


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


@dataclass(frozen=True)
class TypicalTree:
    predicted: float  # uncalibrated A: the tree's predicted accepted tokens
    size: float  # K: drafted nodes scored
    steps_s: float  # probed seconds of its draft steps after the root's


@dataclass
class TreeMemory:
    """Decayed means of the recent trees' figures; none until MIN_TREES trees were recorded."""

    count: int = 0
    weight: float = 0.0
    predicted: float = 0.0
    size: float = 0.0
    steps_s: float = 0.0

    def record(self, tree: TypicalTree) -> None:
        self.count += 1
        self.weight = TREE_DECAY * self.weight + 1
        self.predicted = TREE_DECAY * self.predicted + tree.predicted
        self.size = TREE_DECAY * self.size + tree.size
        self.steps_s = TREE_DECAY * self.steps_s + tree.steps_s

    def typical(self) -> TypicalTree | None:
        if self.count < MIN_TREES:
            return None
        return TypicalTree(self.predicted / self.weight, self.size / self.weight, self.steps_s / self.weight)


@dataclass
class Calibration:
    """Every running estimate of one sizer."""

    accepted: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))
    kept_mass: Ratio = field(default_factory=lambda: Ratio.starting_at(0.9))
    draft_time: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))
    target_time: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))
    alone_time: Ratio = field(default_factory=lambda: Ratio.starting_at(1.0))  # relative to target_time's
    trees: TreeMemory = field(default_factory=TreeMemory)

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
