"""`--budget auto`: the tree grown and scored each iteration is sized by its own predicted
acceptance against measured costs (SpecExec, Appendix A).

Prediction. If the draft's distribution were the target's, verification would reach a drafted
node v (and accept it) with probability P(v) = exp(cumulative draft log-prob of v), so a tree T
is expected to yield A(T) = sum of P(v) over its drafted nodes accepted tokens, plus the one token
the target always supplies. The draft is not the target: a factor c = (observed accepted) /
(predicted A), kept online over recent iterations, calibrates the prediction.

Cost. An iteration spends the draft steps d = d(b_1) + ... + d(b_s) (b = nodes expanded per
draft forward) and one target pass over the root and the K drafted nodes, whose compute takes
tau(K + 1). An offloaded target's pass also needs its streamed layers: the link moves a whole
pass in S seconds, and while the tree grows it stages up to a share f of the next pass (the
ring's slots), so the pass cannot end before the rest, S - min(f * S, d), has arrived:
    T(d, K) = d + max(tau(K + 1), S - min(f * S, d))      (S = 0 in memory: T = d + tau)
With a whole pass staged (f = 1) that is max(d + tau, S): drafting is free until it and the
pass's compute fill the time the link needs anyway. A MoE target streamed by expert stages only
its layers' heads (S); the experts a pass routes to are fetched once its routers have picked them,
and its compute waits F(n) seconds for them, growing with the tokens n (more tokens, more distinct
experts); nothing hides them: T(d, K) gains F(K + 1). The iteration's rate is
    r(K) = (c * A_K + 1) / T(d, K),
with A_K the sum of the K largest P. The K most likely nodes always form a tree (a node is never
more likely than its parent), so any K is a valid cut of the grown tree.

Growth. Before each draft step, the step is taken only if some width b makes the rate expected
after it beat the best rate reachable now. Expanding the b most likely open nodes costs d(b) and
adds, by the running estimate m of the share of a parent's mass its kept children carry, about
m * (sum of their P) of mass with (at least) b new nodes. Because r(K) is a ratio, a step that
raises it is exactly one whose marginal tokens per second beat the current average: growth stops
where the next expansion can no longer pay for itself, which is where a fixed budget would keep
spending.

Costs as iterations take them. The probe times bare forwards; an iteration also catches up,
keeps its tree's books, samples and prunes. The draft's and the target's probed seconds are scaled
by running ratios of what iterations took to what the probe predicted for them (calibration.py).

Drafting nothing. Before an iteration, the target alone (one pass over the root: the
autoregressive step) is weighed against the rate the last drafting iterations achieved:
    r_alone = 1 / (T_alone (1 + L)),   r_tree = sum of their tokens / sum of their seconds,
T_alone being the probe's one-token pass scaled by what the target alone's steps took, and each
drafting iteration's seconds with its catch-up counted as a steady one's (2 tokens: the accepted
leaf and the token after it; the first tree of a reply catches up the prompt, a tree after the
target alone what it emitted). The first drafting iteration of an engine is left out: it pays
the kernels' first use (a 5-node pass took 150 ms where later ones took 55). The iteration
drafts only when r_tree is higher. While it does not, r_tree would go stale, so a
tree is drafted anyway (a look) once what looks cost beyond the target alone stays within a share
L of the time spent without drafting; that share is charged to r_alone above.
"""

import bisect
import math
from dataclasses import dataclass

import numpy as np
import torch

from specchat.decoding.calibration import Calibration

WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)  # expansion widths the growth rule considers
# Tokens a drafting iteration's catch-up runs once drafting is steady: the accepted leaf, which the
# draft never ran, and the token the target supplied after it.
STEADY_CATCH_UP = 2
# The share of the time spent without drafting that looks (trees drafted anyway) may cost.
LOOK_SHARE = 0.02


@dataclass(frozen=True)
class Costs:
    """Measured seconds of a target pass's compute over n tokens and of a draft step over b
    nodes, interpolated linearly between the measured points and extrapolated from the last two;
    for an offloaded target, the seconds the link takes to move a pass and the share of a pass
    staged while the tree grows, and for one streamed by expert the seconds a pass waits for the
    experts it fetches, by its tokens, and from how many tokens its ring moves whole layers (and
    the link's seconds for a pass of those)."""

    target_n: tuple[int, ...]
    target_s: tuple[float, ...]
    draft_b: tuple[int, ...]
    draft_s: tuple[float, ...]
    stream_s: float = 0.0  # S: the link's seconds per pass; 0 when every layer is on the device
    staged: float = 1.0  # f: the share of a pass the staging area holds
    fetch_s: tuple[float, ...] = ()  # F: seconds a pass over target_n[i] tokens waited for the experts it fetched
    wide_from: float = math.inf  # tokens from which a pass's ring loads move whole layers (a MoE streamed by expert)
    wide_stream_s: float = 0.0  # the link's seconds for such a pass

    def stream(self, n: int) -> float:
        """S(n): the link's seconds for a pass over n tokens."""
        return self.wide_stream_s if n >= self.wide_from else self.stream_s

    def fetch(self, n: int) -> float:
        return interpolate(self.target_n, self.fetch_s, n) if self.fetch_s else 0.0

    def target(self, n: int) -> float:
        return interpolate(self.target_n, self.target_s, n)

    def draft(self, b: int) -> float:
        return interpolate(self.draft_b, self.draft_s, b)

    def iteration(self, draft_spent: float, n: int) -> float:
        """T(d, K): drafting for `draft_spent` seconds, then a pass over n tokens."""
        stream = self.stream(n)
        unstaged = stream - min(self.staged * stream, draft_spent)
        return draft_spent + max(self.target(n), unstaged) + self.fetch(n)

    def iterations(self, draft_spent: float, n: np.ndarray) -> np.ndarray:
        """`iteration` at every pass size in `n` at once, the same float64 operations in the same
        order (best_cut weighs every cut of a tree: up to thousands a draft step on a GPU)."""
        stream = np.where(n >= self.wide_from, self.wide_stream_s, self.stream_s)
        unstaged = stream - np.minimum(self.staged * stream, draft_spent)
        fetch = interpolated(self.target_n, self.fetch_s, n) if self.fetch_s else 0.0
        return draft_spent + np.maximum(interpolated(self.target_n, self.target_s, n), unstaged) + fetch


def interpolate(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through (xs, ys); the end segments extend past the ends; never below 0."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def interpolated(xs: tuple[int, ...], ys: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    """`interpolate` at every point of `x`, in the same operations (a test holds them equal to the
    bit). The scalar forms stay: a step calls them dozens of times, 1.4 us a call against 27
    through numpy for one point."""
    if len(xs) == 1:
        return np.full(x.shape, ys[0])
    i = np.clip(np.searchsorted(xs, x, side="left"), 1, len(xs) - 1)
    knots, values = np.asarray(xs), np.asarray(ys, dtype=np.float64)
    x0, x1, y0, y1 = knots[i - 1], knots[i], values[i - 1], values[i]
    return np.maximum(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class Cut:
    size: int  # K: drafted nodes scored by the target
    rate: float  # expected tokens per second of the iteration
    predicted: float  # uncalibrated A_K


@dataclass(frozen=True)
class Choice:
    """Whether the next iteration drafts, and the rates that decided it (tokens per second)."""

    draft: bool
    look: bool  # a tree drafted though the target alone is predicted faster, to measure acceptance again
    with_tree: float  # what the last drafting iterations achieved (0: not judged yet)
    alone: float  # the target alone's, the looks' share of its time taken off


@dataclass(frozen=True)
class Observed:
    """What one iteration did and took, for the online calibration."""

    tokens: int  # emitted
    target_s: float  # the pass, the walk and the bookkeeping after it
    draft_s: float = 0.0  # the catch-up and the tree's growth
    catch_up: int = 0  # tokens the catch-up ran; 0: the iteration drafted nothing
    catch_up_s: float = 0.0  # of draft_s, the catch-up's
    widths: tuple[int, ...] = ()  # nodes each draft step after the root's expanded
    size: int = 0  # K
    predicted: float = 0.0  # uncalibrated A of the cut
    accepted: int = 0


class AutoSizer:
    """Decides, for one engine, whether an iteration drafts at all, how wide each draft step is,
    when growth stops and where the tree is cut; `cap` bounds the tree (and so the target pass)
    whatever the estimates say. The probed `costs` are scaled by what iterations take, unless
    `learns_costs` is off (stand-in costs that must hold as given)."""

    def __init__(self, costs: Costs, cap: int, learns_costs: bool = True) -> None:
        self.costs = costs
        self.cap = cap
        self.learns_costs = learns_costs
        self.calibration = Calibration()
        self.undrafted = 0  # tokens emitted since the last iteration that drafted
        self.warm = False  # a drafting iteration has run: the first pays one-time costs (kernels' first use)

    def draft_s(self, width: int) -> float:
        """Calibrated seconds of a draft step over `width` nodes (or a catch-up of that many tokens)."""
        return self.calibration.draft_time.value * self.costs.draft(width)

    def iteration_s(self, draft_spent: float, n: int) -> float:
        """Calibrated T(d, K): drafting for `draft_spent` seconds, then the target's pass over n tokens."""
        return draft_spent + self.calibration.target_time.value * (self.costs.iteration(draft_spent, n) - draft_spent)

    def iterations_s(self, draft_spent: float, n: np.ndarray) -> np.ndarray:
        """`iteration_s` at every pass size in `n` at once."""
        return draft_spent + self.calibration.target_time.value * (self.costs.iterations(draft_spent, n) - draft_spent)

    def alone_s(self) -> float:
        """Calibrated seconds of the target alone's step (drafting nothing: a pass over the root)."""
        return self.calibration.alone * self.costs.iteration(0.0, 1)

    def excess_catch_up_s(self, pending: int) -> float:
        """Seconds a catch-up of `pending` tokens is expected to take beyond a steady one's: the
        probe's draft step over that many rows, scaled by what long catch-ups took (the probe's
        step also runs the head on every row, which a catch-up runs on its last one only)."""
        long_ones = self.calibration.catch_up_time.value * self.costs.draft(pending)
        return max(0.0, long_ones - self.draft_s(STEADY_CATCH_UP))

    def choose(self, pending: int) -> Choice:
        """Draft the next iteration (its catch-up runs `pending` tokens) or let the target alone
        emit one token, by the rate the last drafting iterations achieved; until there are a few
        (calibration.MIN_TREES) it drafts, to learn. While the target alone is faster, a look is
        drafted once its cost, what a drafting iteration after this catch-up takes beyond the
        target alone making its tokens, fits in LOOK_SHARE of the time spent since the last tree."""
        alone_s = self.alone_s()
        alone = 1 / (alone_s * (1 + LOOK_SHARE))
        drafting = self.calibration.drafting
        if not drafting.known:
            return Choice(draft=True, look=False, with_tree=0.0, alone=alone)
        if drafting.rate > alone:
            return Choice(draft=True, look=False, with_tree=drafting.rate, alone=alone)
        loss = drafting.mean_seconds + self.excess_catch_up_s(pending) - drafting.mean_tokens * alone_s
        look = LOOK_SHARE * self.undrafted * alone_s >= loss
        return Choice(draft=look, look=look, with_tree=drafting.rate, alone=alone)

    def record(self, seen: Observed) -> None:
        """Calibrate by what an iteration took: acceptance, the rate of drafting and the draft's
        and target's times from drafting iterations, the target alone's time from the others.
        Stand-in costs (`learns_costs` off) stand in for the times too."""
        if seen.catch_up == 0:
            self.undrafted += seen.tokens
            if self.learns_costs:
                passes = self.calibration.target_time.value
                self.calibration.alone_time.record_time(passes * self.costs.iteration(0.0, 1), seen.target_s)
            return
        self.undrafted = 0
        self.calibration.record(seen.predicted, seen.accepted)
        if not self.warm:  # its times are not those of the iterations to come
            self.warm = True
            return
        steady_s = self.costs.draft(STEADY_CATCH_UP)  # what a steady catch-up takes, by the probe
        draft_s = steady_s + sum(self.costs.draft(width) for width in seen.widths)
        target_s = self.costs.iteration(draft_s, seen.size + 1) - draft_s
        if self.learns_costs:
            self.learn_costs(seen)
            steady_s = self.draft_s(STEADY_CATCH_UP)
            draft_s, target_s = seen.draft_s - seen.catch_up_s + steady_s, seen.target_s
        self.calibration.drafting.record(seen.tokens, draft_s + target_s)

    def learn_costs(self, seen: Observed) -> None:
        """A drafting iteration's times against the probe's: the draft's, the target's and, for a
        catch-up longer than a steady one, the catch-up's."""
        steps_s = sum(self.costs.draft(width) for width in seen.widths)
        self.calibration.draft_time.record_time(self.costs.draft(seen.catch_up) + steps_s, seen.draft_s)
        pass_s = self.costs.iteration(seen.draft_s, seen.size + 1) - seen.draft_s
        self.calibration.target_time.record_time(pass_s, seen.target_s)
        if seen.catch_up > STEADY_CATCH_UP:
            self.calibration.catch_up_time.record_time(self.costs.draft(seen.catch_up), seen.catch_up_s)

    def best_cut(self, probs: torch.Tensor, draft_spent: float) -> Cut:
        """The K maximizing r(K) over drafted node probabilities `probs`, sorted descending."""
        masses = torch.cat([torch.zeros(1, dtype=torch.float64), probs.double().cumsum(0)])[: self.cap + 1]
        times = torch.from_numpy(self.iterations_s(draft_spent, np.arange(1, masses.numel() + 1)))
        rates = (self.calibration.acceptance * masses + 1) / times
        best = int(rates.argmax())
        return Cut(size=best, rate=float(rates[best]), predicted=float(masses[best]))

    def step_width(self, open_probs: torch.Tensor, probs: torch.Tensor, draft_spent: float) -> int:
        """How many of the open nodes (probabilities `open_probs`, sorted descending) to expand
        next; 0 stops growth. `probs` are every drafted node's, sorted descending."""
        if open_probs.numel() == 0 or probs.numel() >= self.cap and open_probs[0] <= probs[self.cap - 1]:
            return 0
        now = self.best_cut(probs, draft_spent)
        gained = self.calibration.acceptance * self.calibration.branching * open_probs.double().cumsum(0)
        best_width, best_rate = 0, now.rate
        for width in WIDTHS:
            if width > open_probs.numel():
                break
            size = min(now.size + width, self.cap)
            tokens = self.calibration.acceptance * now.predicted + float(gained[width - 1]) + 1
            rate = tokens / self.iteration_s(draft_spent + self.draft_s(width), size + 1)
            if rate > best_rate:
                best_width, best_rate = width, rate
        return best_width
