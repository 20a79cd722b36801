"""A reply's SamplingParams from the settings the front ends name alike (decoding/reply_sampling.py)."""

from dataclasses import fields

from specchat.decoding.events import SamplingParams
from specchat.decoding.reply_sampling import AS_GIVEN, reply_sampling
from specchat.limits import SAMPLING_BOUNDS

SETTINGS = {"temperature": 0.7, "top_p": 0.8, "top_k": -1, "min_p": 0.05, "typical_p": 0.9, "top_n_sigma": 1.5,
            "xtc_probability": 0.3, "xtc_threshold": 0.2, "dynatemp_range": 0.5, "dynatemp_exponent": 2.0,
            "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1}


def test_every_checked_setting_reaches_the_replys_sampling():
    """The names the front ends check (limits.SAMPLING_BOUNDS) are the ones read here: a setting
    added to one and not the other fails."""
    assert set(SAMPLING_BOUNDS) == {*AS_GIVEN, "top_k", "mirostat", "mirostat_tau", "mirostat_eta"}
    assert set(AS_GIVEN) <= {field.name for field in fields(SamplingParams)}


def test_the_settings_become_the_params_with_vllms_top_k_off_as_zero():
    assert reply_sampling(SETTINGS, 4) == SamplingParams(temperature=0.7, top_p=0.8, seed=4, top_k=0, min_p=0.05,
                                                         typical_p=0.9, top_n_sigma=1.5, xtc_probability=0.3,
                                                         xtc_threshold=0.2, dynatemp_range=0.5,
                                                         dynatemp_exponent=2.0)
    assert reply_sampling({**SETTINGS, "top_k": 40}, 4).top_k == 40


def test_each_reply_starts_its_own_mirostat():
    settings = {**SETTINGS, "mirostat": 2, "mirostat_tau": 3.0}
    first, second = reply_sampling(settings, 1).mirostat, reply_sampling(settings, 1).mirostat
    assert first is not second and first.mu == second.mu == 6.0 and first.spec.version == 2
