"""The keyed uniforms every random decision of a reply is (keyed.py): SplitMix64's draw pinned
apart from its code, and the streams each purpose keys."""

from itertools import product

import numpy as np
import pytest
from scipy import stats

from specchat.decoding.keyed import Purpose, derived_key, derived_uniform, uniform


def test_uniform_is_deterministic_and_in_unit_interval():
    keys = [(seed, pos) for seed in (0, 1, 12345, -7, 2**70) for pos in range(2000)]
    values = [uniform(seed, pos) for seed, pos in keys]
    assert values == [uniform(seed, pos) for seed, pos in keys]
    assert all(0.0 <= v < 1.0 for v in values)
    # 53-bit resolution: every value is an exact multiple of 2**-53.
    assert all((v * 2**53).is_integer() for v in values)


MASK64 = 2**64 - 1


def splitmix64(state: int, count: int) -> list[int]:
    """SplitMix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c), written here apart from the
    product: `count` outputs from `state`."""
    outputs = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        outputs.append(z ^ (z >> 31))
    return outputs


def test_this_splitmix64_gives_the_published_outputs():
    """Rosetta Code's "Pseudo-random numbers/Splitmix64": the first five outputs for seed 1234567."""
    assert splitmix64(1234567, 5) == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                      4593380528125082431, 16408922859458223821]


@pytest.mark.parametrize("seed", [0, 1, 1234, -7, 2**70])
def test_uniform_is_the_documented_draw(seed):
    """The draw every seeded engine and the independent reference share, pinned apart from its
    code: output n + 1 of SplitMix64 started at the seed's hash (SplitMix64's output function,
    i.e. its first output from state seed - GAMMA), its top 53 bits over 2**53. A change inside
    `uniform` changes every seeded reply; this is what would say so."""
    gamma = 0x9E3779B97F4A7C15
    hashed = splitmix64((seed - gamma) & MASK64, 1)[0]
    expected = [(output >> 11) / 2**53 for output in splitmix64(hashed, 100)]
    assert [uniform(seed, position) for position in range(100)] == expected


def test_uniform_differs_for_neighbouring_positions_and_seeds():
    for seed in range(20):
        for pos in range(200):
            u = uniform(seed, pos)
            assert u != uniform(seed, pos + 1)
            assert u != uniform(seed + 1, pos)


def test_uniform_streams_of_different_seeds_do_not_overlap():
    # A naive key like seed * GAMMA + position would make seed 1 a shifted copy of seed 0.
    first = {uniform(0, pos) for pos in range(5000)}
    for seed in (1, 2, 3, 1000):
        assert first.isdisjoint(uniform(seed, pos) for pos in range(5000))


@pytest.mark.parametrize("seed", [0, 1, 987654321])
def test_uniform_is_roughly_uniform_and_uncorrelated(seed):
    u = np.array([uniform(seed, pos) for pos in range(20_000)])
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # Lag-1 and cross-seed correlations: ~N(0, 1/sqrt(20000) = 0.007) if independent.
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.03
    other = np.array([uniform(seed + 1, pos) for pos in range(20_000)])
    assert abs(np.corrcoef(u, other)[0, 1]) < 0.03



# Every name, aliases included: iterating an IntEnum skips a member whose value repeats another's,
# and two purposes sharing a value would share a stream (a draft's draws deciding its acceptance).
PURPOSES = list(Purpose.__members__.values())


def test_derived_keys_are_distinct():
    keys = [derived_key(seed, purpose, index) for seed, purpose, index in product(range(20), PURPOSES, range(50))]
    assert len(set(keys)) == len(keys)
    assert len(set(keys) | set(range(20))) == len(keys) + 20  # none is a plain seed either


def test_derived_uniforms_differ_by_purpose_index_and_position():
    values = {derived_uniform(3, purpose, index, position)
              for purpose, index, position in product(PURPOSES, range(4), range(10, 20))}
    assert len(values) == len(PURPOSES) * 4 * 10
    assert derived_uniform(3, Purpose.EMIT, 0, 12) != uniform(3, 12)
    assert derived_uniform(3, Purpose.EMIT, 0, 12) == derived_uniform(3, Purpose.EMIT, 0, 12)
