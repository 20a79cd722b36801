"""How much of their draws (prompts, soak turns, tokens) the real tests take on this machine,
measured once a run by the process that starts the others (xdist's controller, or the only
process) and handed to every worker in SCALE_ENV, so that all of them size the same references.

The real tests were sized for the suite's 25 minutes on the project's AVX-512 machines. On the
AVX2 AMD EPYC the same suite took 47 minutes (2026-12-04, code 29c9cba: 4630 of its 5532
worker-seconds in tests/real), most of it float32 tree passes of the target: there MKL multiplies a few rows at a
fraction of the core's speed (one thread, a 1536 x 8960 float32 weight: 3.5-5 ms for one row,
17-25 ms for 16, where AVX-512's doubled width predicts about half of that elsewhere). Where that
16-row product takes SLOW_MS or more, each real draw is halved, rounded up (`scaled`): one
MT-Bench prompt in the exactness runs instead of two (each reply still its 32 tokens), 15 soak
turns instead of 30. `SPECCHAT_SUITE_SCALE=1` runs the full draws on any machine. Halved, the
suite still took 43 minutes there on a slower day (docs/benchmarks.md, the AVX2 suite's row): most
exactness tests judge one prompt a mode already, so halving the prompts leaves them as they were.
"""

import math
import os
from dataclasses import dataclass

SCALE_ENV = "SPECCHAT_SUITE_SCALE"
SLOW_MS = 12.0  # a 16-row one-thread float32 product slower than this halves the draws
HALF = 0.5
IN_FEATURES, OUT_FEATURES = 1536, 8960  # the 1.5B target's gate and up projections
ROWS = 16  # the width of the suite's budget-16 trees
WEIGHTS = 4  # distinct weights, 220 MB of float32: past the caches, as a pass's weights are


@dataclass(frozen=True)
class Scale:
    factor: float  # of each draw, in (0, 1]
    product_ms: float | None  # the measured product; None where SCALE_ENV was set beforehand

    def describe(self) -> str:
        if self.product_ms is None:
            return f"real tests' draws at {self.factor:g} of full ({SCALE_ENV} set)"
        return (f"real tests' draws at {self.factor:g} of full (a {ROWS}-row float32 product took "
                f"{self.product_ms:.1f} ms on one thread; full below {SLOW_MS:g})")


def product_ms() -> float:
    """One thread's F.linear of ROWS rows by each of WEIGHTS weights, in ms a weight: the
    fastest of the startup probes' timed rounds (quant/timing.py). Imported here: the controller
    imports torch only when it measures."""
    import torch

    from specchat.quant.timing import best_seconds

    generator = torch.Generator().manual_seed(0)
    weights = [torch.rand(OUT_FEATURES, IN_FEATURES, generator=generator) for _ in range(WEIGHTS)]
    x = torch.rand(ROWS, IN_FEATURES, generator=generator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        [seconds] = best_seconds([lambda: [torch.nn.functional.linear(x, weight) for weight in weights]],
                                 torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    return seconds / WEIGHTS * 1e3


def factor_for(milliseconds: float) -> float:
    return HALF if milliseconds >= SLOW_MS else 1.0


def decide_scale(measure=product_ms) -> Scale:
    """SCALE_ENV's factor where it is set, else one measured now (and set, for the workers)."""
    if SCALE_ENV in os.environ:
        return Scale(suite_scale(), None)
    milliseconds = measure()
    scale = Scale(factor_for(milliseconds), milliseconds)
    os.environ[SCALE_ENV] = str(scale.factor)
    return scale


def suite_scale() -> float:
    """SCALE_ENV's factor (1 where it is unset: a script importing the helpers outside pytest)."""
    text = os.environ.get(SCALE_ENV, "1")
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not 0 < factor <= 1:
        raise ValueError(f"{SCALE_ENV} must be a number in (0, 1], not {text!r}")
    return factor


def scaled(count: int) -> int:
    """`count` of a real test's draws at this run's factor: rounded up, at least one."""
    return max(1, math.ceil(count * suite_scale()))
