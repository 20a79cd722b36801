"""The offline simulator of Distributed Speculative Inference (DSI; Timor et al. 2024, "Distributed
Speculative Inference of Large Language Models", arXiv 2405.14105): the latency of generating T
tokens without speculation (non-SI), with speculative inference (SI) and with DSI.

Units and assumptions (the paper's): time is counted in target forwards, one target forward takes
1 whatever the number of tokens it scores; one drafter forward (one drafted token) takes c, with
0 < c <= 1; the draft proposed for each position, given the correct prefix, is accepted
independently with probability a (the acceptance rate). Each position n carries one uniform draw
u_n from a numpy Generator seeded with the seed number, and its draft is accepted iff u_n < a: SI
and DSI face the same acceptances (and a grid's cells the same draws). Latencies are averaged over
the seeds.

non-SI: one target forward per token: latency T, exactly (nothing random).

SI with lookahead k (simulated on the acceptances): an iteration at position p drafts k tokens
(time k c), then one target forward (time 1) scores them. With G <= k the number of leading
accepted drafts, it commits those G and the target's own token (its correction at p + G if G < k,
its bonus token at p + k if G = k; the bonus uses no acceptance draw):
    p <- p + G + 1 per iteration until p >= T,   latency = iterations * (k c + 1).
An iteration commits E = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a) tokens in expectation (k + 1 at
a = 1), so E[latency] ~ T (k c + 1) / E. Iterations draft all k tokens, even near the end.

DSI with lookahead k and N target servers (a discrete-event simulation): the drafter never waits.
A segment starts at time t0 with the committed text ending before position p (t0 = 0 at first).
The drafter drafts offsets i = 0, 1, 2, ... from p; draft i is done at t0 + (i + 1) c. Verification
jobs of the target are sent
  (1) every k drafts: with d = 0, k, 2k, ... drafts, at t0 + d c (d = 0 is the target computing the
      next token at once, as non-SI does);
  (2) at once, with every draft done by then (d = floor((t - t0) / c)), whenever the last job sent
      finishes at t before the next job of (1) is due: the target never idles waiting for k drafts.
      This only happens when k c > 1; without it DSI would fall behind non-SI there.
Jobs wait first-in first-out for one of N servers: job j starts at max(sent_j, finish_(j-N)) and
finishes 1 later. A job with d drafts returns the target's tokens at offsets 0..d, so its finish
decides every offset <= d (the draft at offset d is done by then, as c <= 1). Jobs finish in the
order sent and cover growing d, so offset q is decided at
    t0 + r(q),   r(q) = finish - t0 of the first job with d >= q   (non-SI: r(q) = q + 1).
At the first rejected offset m, at t0 + r(m) the m accepted drafts and the target's token at m are
committed, every other job (running or waiting) and every draft beyond m are dropped, and the next
segment starts at t0 + r(m) from position p + m + 1 with all servers free. A segment's schedule does
not depend on the acceptances, only where it is cut: r is simulated once per (c, k, N) and the
acceptances are walked segment by segment,
    latency = sum over segments of r(m_i), the last one ending at r(T - 1 - p) (the T-th token).

Servers: with k c <= 1 the jobs of (1) are sent k c apart and each runs for 1, so at most
ceil(1 / (k c)) run at once (the paper's bound); with k c > 1 at most 2 do (a job of (2) and the
next of (1)). With `sufficient_servers` no job ever waits, and then DSI's latency is at most
min(SI, non-SI) on each acceptance sequence (the paper's theorems; the tests check whole grids).
"""

import math
from dataclasses import dataclass

import numpy as np

SLACK = 1e-9  # float slack when counting the drafts done at an instant (one ending then counts)


def non_si_latency(tokens: int) -> float:
    """One target forward per token."""
    return float(tokens)


def acceptance_draws(seeds: int, positions: int) -> np.ndarray:
    """u[s, n] ~ U[0, 1) drawn by numpy's Generator seeded with s; position n is accepted iff u < a."""
    return np.stack([np.random.default_rng(seed).random(positions) for seed in range(seeds)])


def accepted_runs(accepted: np.ndarray) -> np.ndarray:
    """runs[..., n]: how many consecutive positions from n on are accepted (0 if n is rejected),
    counted up to the end of the array."""
    length = accepted.shape[-1]
    positions = np.arange(length)
    rejections = np.where(accepted, length, positions)
    # the first rejection at or after n: a running minimum from the end
    next_rejection = np.minimum.accumulate(rejections[..., ::-1], axis=-1)[..., ::-1]
    return next_rejection - positions


def simulate_si(accepted: np.ndarray, drafter_latency: float, lookahead: int, tokens: int) -> np.ndarray:
    """SI's latency for each row of `accepted` (rows x at least tokens + lookahead - 1 positions)."""
    runs = accepted_runs(accepted)
    rows = np.arange(len(runs))
    position = np.zeros(len(runs), dtype=int)
    iterations = np.zeros(len(runs))
    while (active := position < tokens).any():
        # G = min(run, k) accepted drafts, then the target's correction or bonus token
        position[active] += np.minimum(runs[rows[active], position[active]], lookahead) + 1
        iterations[active] += 1
    return iterations * (lookahead * drafter_latency + 1)


def simulate_dsi(accepted: np.ndarray, drafter_latency: float, lookahead: int, servers: int | None,
                 tokens: int) -> np.ndarray:
    """DSI's latency for each row of `accepted` (rows x at least `tokens` positions); `servers`
    None: as many as ever needed."""
    decided = decision_times(drafter_latency, lookahead, servers, tokens)
    runs = accepted_runs(accepted)
    rows = np.arange(len(runs))
    position = np.zeros(len(runs), dtype=int)
    latency = np.zeros(len(runs))
    while (active := position < tokens).any():
        start = position[active]
        # the segment ends at its first rejected offset, or at the T-th token if that comes first
        offset = np.minimum(runs[rows[active], start], tokens - 1 - start)
        latency[active] += decided[offset]
        position[active] = start + offset + 1
    return latency


def decision_times(drafter_latency: float, lookahead: int, servers: int | None, tokens: int) -> np.ndarray:
    """r(q) for the offsets q = 0..tokens-1 of a segment started at 0: when the target's token at
    offset q is known, given that every draft before it is accepted."""
    drafts, finishes = verification_jobs(drafter_latency, lookahead, servers, tokens - 1)
    return np.asarray(finishes)[np.searchsorted(drafts, np.arange(tokens))]


def verification_jobs(drafter_latency: float, lookahead: int, servers: int | None,
                      last_offset: int) -> tuple[list[int], list[float]]:
    """The drafts covered and the finish time of each job of a segment started at 0 with no
    rejection, in the order sent, up to the first that covers `last_offset`."""
    drafts: list[int] = []
    finishes: list[float] = []
    sent, covered = 0.0, 0  # the job of rule (1) with d = 0
    while True:
        waits = servers is not None and len(finishes) >= servers
        finishes.append(max(sent, finishes[-servers]) + 1 if waits else sent + 1)
        drafts.append(covered)
        if covered >= last_offset:
            return drafts, finishes
        block = lookahead * (covered // lookahead + 1)  # the next multiple of k
        if block * drafter_latency <= finishes[-1]:  # rule (1)
            sent, covered = block * drafter_latency, block
        else:  # rule (2): nothing runs or waits from finishes[-1] on
            sent, covered = finishes[-1], math.floor(finishes[-1] / drafter_latency + SLACK)


def sufficient_servers(min_drafter_latency: float, lookahead: int) -> int:
    """max(ceil(1 / (k c_min)), 2): no verification job waits for any c >= c_min."""
    return max(math.ceil(1 / (lookahead * min_drafter_latency) - SLACK), 2)


def expected_tokens_per_iteration(acceptance: float, lookahead: int) -> float:
    """E[min(G, k) + 1] = sum_{i=0..k} a^i: SI's expected tokens per target forward."""
    return float(sum(acceptance**i for i in range(lookahead + 1)))


def acceptance_from_gen_rate(gen_rate: float, lookahead: int) -> float:
    """The a whose expected tokens per iteration sum_{i=0..k} a^i equals `gen_rate` (increasing in
    a from 1 at a = 0 to k + 1 at a = 1; clipped to those ends), by bisection."""
    low, high = 0.0, 1.0
    for _ in range(60):  # 2^-60: below float resolution
        middle = (low + high) / 2
        if expected_tokens_per_iteration(middle, lookahead) < gen_rate:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True)
class Latencies:
    """Mean latencies over the seeds, in target forwards, indexed [acceptance, drafter latency]."""

    si: np.ndarray
    dsi: np.ndarray
    non_si: np.ndarray

    def ratios(self) -> dict[str, np.ndarray]:
        """The paper's four latency ratios, by name; below 1 the numerator is faster."""
        return {
            "SI / non-SI": self.si / self.non_si,
            "DSI / SI": self.dsi / self.si,
            "DSI / non-SI": self.dsi / self.non_si,
            "DSI / min(SI, non-SI)": self.dsi / np.minimum(self.si, self.non_si),
        }


@dataclass(frozen=True)
class Grid:
    """The cells drafter latency x acceptance rate of one lookahead, server count and length."""

    drafter_latencies: np.ndarray  # c, each in (0, 1]
    acceptances: np.ndarray  # a, each in [0, 1]
    lookahead: int
    servers: int | None  # None: as many as ever needed
    tokens: int
    seeds: int

    def server_count(self) -> int:
        """N; with servers None, the count that suffices over the grid."""
        return self.servers if self.servers is not None else sufficient_servers(min(self.drafter_latencies),
                                                                                self.lookahead)

    def latencies(self) -> Latencies:
        k, tokens = self.lookahead, self.tokens
        draws = acceptance_draws(self.seeds, tokens + k)
        # rows: (acceptance, seed); the draws are shared, so a higher a accepts a superset
        accepted = (draws[None] < self.acceptances[:, None, None]).reshape(-1, tokens + k)
        si = [simulate_si(accepted, c, k, tokens) for c in self.drafter_latencies]
        dsi = [simulate_dsi(accepted, c, k, self.servers, tokens) for c in self.drafter_latencies]
        shape = (len(self.acceptances), self.seeds, len(self.drafter_latencies))
        mean_si = np.stack(si, axis=-1).reshape(shape).mean(axis=1)
        mean_dsi = np.stack(dsi, axis=-1).reshape(shape).mean(axis=1)
        return Latencies(si=mean_si, dsi=mean_dsi, non_si=np.full(mean_si.shape, non_si_latency(tokens)))
