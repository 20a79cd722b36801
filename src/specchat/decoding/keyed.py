"""Uniform numbers keyed by (seed, position), with no generator state: every random decision a
reply makes is one of them, so none depends on how many tree nodes, branches or verification
steps an engine evaluated before reaching a position (sampling.py's argument). Each purpose has
its own stream: the emitted token's u_n, speculative sampling's draws (speculative_sampling.py)
and XTC's coin (llama_cuts.py)."""

from enum import IntEnum

_MASK64 = (1 << 64) - 1
# SplitMix64's increment: 2**64 / golden ratio, odd, so the state visits all 2**64 values.
_GAMMA = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64-bit ints with
    full avalanche, i.e. flipping any input bit flips each output bit with probability ~1/2."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) keyed by (seed, absolute token position), with no RNG state.

    This is output number ``position + 1`` of a SplitMix64 generator whose state starts at
    ``mix64(seed)``: ``mix64(mix64(seed) + (position + 1) * GAMMA)``. Hashing the seed first
    puts different seeds at unrelated points of the 2**64 cycle (with ``seed * GAMMA`` instead,
    seed s at position n would equal seed 0 at position n + s). The top 53 bits fill a double's
    mantissa exactly, so the result is a multiple of 2**-53 and at most 1 - 2**-53.
    """
    state = (mix64(seed) + (position + 1) * _GAMMA) & _MASK64
    return (mix64(state) >> 11) / (1 << 53)


class Purpose(IntEnum):
    """What a uniform decides; each purpose has its own key, hence its own stream."""

    DRAFT = 1  # index: the stem whose draft token at the position is sampled
    ACCEPT = 2  # index: the candidate's rank among those tested at the position
    EMIT = 3  # index 0: the token sampled from the residual (or from p, the bonus token)
    XTC = 4  # index 0: whether XTC cuts the top choices at the position (llama_cuts.py)


def derived_key(seed: int, purpose: Purpose, index: int) -> int:
    """A 64-bit key for one (seed, purpose, index), chained through SplitMix64's finalizer.

    mix64 is a bijection, so for one seed distinct purposes give distinct intermediate keys; the
    index is then mixed into a pseudo-random 64-bit value, so two (purpose, index) pairs collide
    only by a 64-bit hash accident.
    """
    return mix64(mix64(mix64(seed) ^ int(purpose)) ^ index)


def derived_uniform(seed: int, purpose: Purpose, index: int, position: int) -> float:
    """The uniform in [0, 1) that decides `purpose` for `index` at absolute `position`."""
    return uniform(derived_key(seed, purpose, index), position)
